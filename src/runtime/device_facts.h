/* What clattn relies on about a device, in one place: the tuning lookup and the ops' launch
 * plans read the limits here, under the CLATTN_MAX_* caps (config.h). Read from the driver at
 * each call (clGetDeviceInfo is cheap, and a test may change a cap between calls). Not
 * installed. */
#ifndef CLATTN_RUNTIME_DEVICE_FACTS_H
#define CLATTN_RUNTIME_DEVICE_FACTS_H

#include "status.h"

#include <stdbool.h>

/* CL_DEVICE_MAX_WORK_GROUP_SIZE: the limit of CLBlast's kernels, which the caps do not reach. */
size_t clattn__device_group_limit(cl_device_id device);
/* The largest group clattn's own kernels may take: the device's under CLATTN_MAX_WORK_GROUP (a
 * malformed cap is reported by the launch, which reads it again). */
size_t clattn__device_max_group(cl_device_id device);
/* CL_DEVICE_LOCAL_MEM_SIZE under CLATTN_MAX_LOCAL_MEMORY (likewise). */
cl_ulong clattn__device_local_bytes(cl_device_id device);
/* CL_DEVICE_MAX_COMPUTE_UNITS, at least 1. */
cl_uint clattn__device_compute_units(cl_device_id device);
/* CL_DEVICE_GLOBAL_MEM_CACHE_SIZE (0 where the device has none or does not say). */
cl_ulong clattn__device_cache_bytes(cl_device_id device);
/* CL_DEVICE_MEM_BASE_ADDR_ALIGN in bytes: every buffer and sub-buffer starts on a multiple. */
cl_uint clattn__device_base_align_bytes(cl_device_id device);
/* CL_DEVICE_PROFILE is FULL_PROFILE: vstore_half's default rounding is to nearest even (an
 * embedded profile may round toward zero). */
bool clattn__device_full_profile(cl_device_id device);

/* Whether CL_DEVICE_EXTENSIONS holds `name` as a whole word: one query, for the checks that run
 * on every call (clattn__device_facts_get makes a dozen). */
bool clattn__device_has_extension(cl_device_id device, const char *name);

/* Every fact at once, for reports (clattn_device_facts) and for the capability probes of
 * optional features: what the driver says, never a vendor name. */
typedef struct clattn__device_facts {
    char opencl[16], opencl_c[16]; /* "3.0", "1.2": from CL_DEVICE_VERSION and its OpenCL C */
    cl_device_type type;
    cl_ulong local_bytes; /* under CLATTN_MAX_LOCAL_MEMORY */
    size_t max_group;     /* under CLATTN_MAX_WORK_GROUP */
    cl_uint compute_units;
    cl_ulong cache_bytes;              /* CL_DEVICE_GLOBAL_MEM_CACHE_SIZE */
    cl_uint vector_float, vector_half; /* CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT, _HALF */
    bool fp16, fp64;                   /* cl_khr_fp16; cl_khr_fp64 or a double config */
    bool subgroups;        /* cl_khr_subgroups, cl_intel_subgroups, or sub-groups in OpenCL 2.1+ */
    char extensions[4096]; /* CL_DEVICE_EXTENSIONS (cut to fit) */
} clattn__device_facts;
int clattn__device_facts_get(cl_device_id device, clattn__device_facts *facts);

#endif
