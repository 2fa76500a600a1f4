/* The tuning table (tuning_table.def) and its overrides: the launch parameters of an op on a
 * device, declared per op in tuning_params.h. Not installed. */
#ifndef CLATTN_TUNING_H
#define CLATTN_TUNING_H

#include "status.h"
#include "tuning_params.h"

#define CLATTN__TUNING_MAX_PARAMS 32

/* An op's parameters as the generic lookup sees them (made from tuning_params.h): names, the
 * "default" row, the range each value must lie in, the kernel macro each is built with (NULL:
 * host only), and the device limits a whole set must fit (NULL: fits; else why not, for the
 * warning or the error). */
typedef struct clattn__tuning_op {
    const char *name;
    int count;
    const char *params[CLATTN__TUNING_MAX_PARAMS];
    long defaults[CLATTN__TUNING_MAX_PARAMS];
    long min[CLATTN__TUNING_MAX_PARAMS], max[CLATTN__TUNING_MAX_PARAMS];
    const char *macros[CLATTN__TUNING_MAX_PARAMS];
    bool has_default; /* false: a device without a row has none (gemm keeps CLBlast's own) */
    const char *(*fits)(cl_device_id device, const long *values);
} clattn__tuning_op;

/* Per op (clattn__attention_tuning and so on): the typed parameters (t.BM), the op's
 * descriptor, its lookup (clattn__tuning_get, typed), a row of the table by device key
 * (clattn__tuning_row, typed), and the build options of the parameters that have a kernel
 * macro (" -DBM=4 -DBN=16 ...", appended to the NUL-terminated `out`). */
#define CLATTN__TUNING_FIELD(NAME, DEFAULT, MIN, MAX, MACRO) long NAME;
#define CLATTN__TUNING_DECLARE(op, PARAMS, has_default)                                            \
    typedef struct clattn__##op##_tuning {                                                         \
        PARAMS(CLATTN__TUNING_FIELD)                                                               \
    } clattn__##op##_tuning;                                                                       \
    extern const clattn__tuning_op clattn__tuning_##op;                                            \
    int clattn__##op##_tuning_get(cl_device_id device, clattn_dtype dtype,                         \
                                  clattn__##op##_tuning *t);                                       \
    int clattn__##op##_tuning_row(clattn_dtype dtype, const char *key, clattn__##op##_tuning *t);  \
    void clattn__##op##_tuning_options(const clattn__##op##_tuning *t, char *out, size_t capacity);
CLATTN__TUNING_OPS(CLATTN__TUNING_DECLARE)
#undef CLATTN__TUNING_DECLARE

/* The parameters `op` runs with on `device` for storage dtype `dtype`: the first table row, by
 * level (exact name, vendor and type, type, default), that fits the device, then the overrides
 * (clattn_tuning_override, CLATTN_TUNE) on top. A row that does not fit is skipped with a
 * warning; the default row is used even then (the op clamps what it must). Fails with
 * CLATTN_ERR_INVALID_TUNING when CLATTN_TUNE is malformed or an override does not fit. */
int clattn__tuning_get(cl_device_id device, const clattn__tuning_op *op, clattn_dtype dtype,
                       long *values);

/* clattn__tuning_get for an op whose rows are optional (gemm: without one, CLBlast keeps its
 * own database): *found says whether a row or a complete override gave the values. An override
 * that gives only some parameters with no row under it fails. */
int clattn__tuning_find(cl_device_id device, const clattn__tuning_op *op, clattn_dtype dtype,
                        long *values, bool *found);

/* The row of `op` for one device key ("default", "type:gpu"), without overrides: tests run
 * each class's row on any device. */
int clattn__tuning_row(const clattn__tuning_op *op, clattn_dtype dtype, const char *key,
                       long *values);

/* `op`'s parameters as the table and the overrides write them ("NAME=value,..."), in `capacity`
 * bytes (CLATTN_TUNING_PARAMS_MAX hold any op's): false when they do not all fit (the text then
 * ends after the last that did). */
bool clattn__tuning_format(const clattn__tuning_op *op, const long *values, char *text,
                           size_t capacity);

/* Forgets the table answers kept for the lookups (tuning.c, the memo), releasing their devices:
 * clattn_cache_clear(NULL) and the test row call it. */
void clattn__tuning_forget(void);

/* Parses every row of the table: each names a known op and gives all its parameters within
 * their ranges (whether a row fits a device is checked at lookup). */
int clattn__tuning_check_table(void);

#endif
