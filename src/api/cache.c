/*
 * clattn_cache_clear: the one public call that reaches both the runtime's program cache and the
 * CLBlast bridge's, so it sits above both layers.
 */
#include "ops/blas.h"
#include "runtime/matrix_units.h"
#include "runtime/program_cache.h"
#include "runtime/tuning.h"

void clattn_cache_clear(cl_context context) {
    clattn__program_cache_clear(context);
    clattn__matrix_units_clear(context);
    if (!context) {
        clattn__blas_cache_clear();
        clattn__tuning_forget();
    }
}
