/*
 * The CLBlast bridge (blas.h): the library's only caller of CLBlast.
 */
#include "blas.h"
#include "runtime/hooks.h"
#include "runtime/tuning.h"

#include <clblast_c.h>
#include <stdatomic.h>
#include <pthread.h>
#include <string.h>

/* ---- the gemm row: CLBlast's Xgemm parameters, from clattn's tuning table ---- */

/* The parameters last given to CLBlast, per device: CLBlast drops its compiled GEMM when they
 * change, so they are given again only when they differ. Without a row (or an override) CLBlast
 * keeps its own database; once given, parameters stay until others replace them (CLBlast's C
 * API cannot restore its database's). */
#define GEMM_DEVICES 16
static pthread_mutex_t gemm_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    cl_device_id device;
    long values[CLATTN__TUNING_MAX_PARAMS];
} gemm_given[GEMM_DEVICES];

/* The row's first 14 parameters are the Xgemm kernel's, the last the GEMM routine's. */
#define GEMM_KERNEL_PARAMS 14

static int give_clblast(cl_device_id device, const long *values) {
    const clattn__tuning_op *op = &clattn__tuning_gemm;
    /* the GEMMK=0 kernel, whose parameters the row holds; KREG is the other kernel's */
    const char *names[GEMM_KERNEL_PARAMS + 2] = {"GEMMK", "KREG"};
    size_t given[GEMM_KERNEL_PARAMS + 2] = {0, 1};
    for (int i = 0; i < GEMM_KERNEL_PARAMS; ++i) {
        names[i + 2] = op->params[i];
        given[i + 2] = (size_t)values[i];
    }
    const char *routine_name[1] = {"XGEMM_MIN_INDIRECT_SIZE"};
    const size_t routine_value[1] = {(size_t)values[GEMM_KERNEL_PARAMS]};
    const char *what = "Xgemm";
    CLBlastStatusCode status = CLBlastOverrideParameters(device, "Xgemm", CLBlastPrecisionSingle,
                                                         GEMM_KERNEL_PARAMS + 2, names, given);
    if (status == CLBlastSuccess) {
        what = "GemmRoutine";
        status = CLBlastOverrideParameters(device, "GemmRoutine", CLBlastPrecisionSingle, 1,
                                           routine_name, routine_value);
    }
    if (status == CLBlastSuccess) return CLATTN_SUCCESS;
    return clattn__fail(CLATTN_ERR_BLAS, "CLBlastOverrideParameters (%s) returned %d", what,
                        (int)status);
}

int clattn__blas_prepare(cl_device_id device) {
    long values[CLATTN__TUNING_MAX_PARAMS] = {0};
    bool found = false;
    int status = clattn__tuning_find(device, &clattn__tuning_gemm, CLATTN_F32, values, &found);
    if (status != CLATTN_SUCCESS || !found) return status;
    pthread_mutex_lock(&gemm_lock);
    int slot = 0;
    while (slot < GEMM_DEVICES - 1 && gemm_given[slot].device && gemm_given[slot].device != device)
        ++slot;
    if (gemm_given[slot].device != device ||
        memcmp(gemm_given[slot].values, values, sizeof values) != 0) {
        status = give_clblast(device, values);
        if (status == CLATTN_SUCCESS) {
            gemm_given[slot].device = device;
            memcpy(gemm_given[slot].values, values, sizeof values);
        }
    }
    pthread_mutex_unlock(&gemm_lock);
    return status;
}

bool clattn__blas_overridden(cl_device_id device) {
    pthread_mutex_lock(&gemm_lock);
    bool given = false;
    for (int slot = 0; slot < GEMM_DEVICES && !given; ++slot)
        given = gemm_given[slot].device == device;
    pthread_mutex_unlock(&gemm_lock);
    return given;
}

int clattn__sgemm_batched(const clattn__call *call, bool trans_b, size_t m, size_t n, size_t k,
                          const clattn__matrices *a, const clattn__matrices *b, float beta,
                          const clattn__matrices *c, size_t batch) {
    cl_command_queue queue = call->queue;
    int applied = clattn__blas_prepare(call->device);
    if (applied != CLATTN_SUCCESS) return applied;
    const CLBlastTranspose tb = trans_b ? CLBlastTransposeYes : CLBlastTransposeNo;
    /* the kernel trace (hooks.h) gets the event of CLBlast's last kernel of the GEMM */
    cl_event traced = NULL, *event = clattn__tracing() ? &traced : NULL;
    /* one matrix takes CLBlast's plain GEMM, whose checks do not ask for batch strides */
    CLBlastStatusCode status =
        clattn__fault_hit(CLATTN__FAULT_GEMM) ? CLBlastUnexpectedError
        : batch == 1
            ? CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, tb, m, n, k, 1.0f, a->buffer,
                           a->offset, a->ld, b->buffer, b->offset, b->ld, beta, c->buffer,
                           c->offset, c->ld, &queue, event)
            : CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, CLBlastTransposeNo, tb, m, n, k,
                                         1.0f, a->buffer, a->offset, a->ld, a->stride, b->buffer,
                                         b->offset, b->ld, b->stride, beta, c->buffer, c->offset,
                                         c->ld, c->stride, batch, &queue, event);
    if (traced) {
        clattn__trace_record(batch == 1 ? "CLBlast Xgemm" : "CLBlast Xgemm batched", traced);
        clReleaseEvent(traced);
    }
    if (status == CLBlastSuccess) return CLATTN_SUCCESS;
    /* OpenCL's codes run from -1 to -72 (and extensions' below -1000 are not CLBlast's) */
    const char *what = batch == 1 ? "CLBlastSgemm" : "CLBlastSgemmStridedBatched";
    if (status < 0 && status > -100) return clattn__cl_fail(status, what);
    return clattn__fail(CLATTN_ERR_BLAS, "%s (m %zu n %zu k %zu, batch %zu) returned %d", what, m,
                        n, k, batch, (int)status);
}

void clattn__blas_cache_clear(void) {
    CLBlastClearCache();
}
