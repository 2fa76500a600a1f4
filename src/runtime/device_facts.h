/* What clattn relies on about a device, in one place: the tuning lookup and the ops' launch
 * plans read the limits here, under the CLATTN_MAX_* caps (config.h). Read from the driver at
 * each call (clGetDeviceInfo is cheap, and a test may change a cap between calls). Not
 * installed. */
#ifndef CLATTN_RUNTIME_DEVICE_FACTS_H
#define CLATTN_RUNTIME_DEVICE_FACTS_H

#include "status.h"

/* CL_DEVICE_MAX_WORK_GROUP_SIZE: the limit of CLBlast's kernels, which the caps do not reach. */
size_t clattn__device_group_limit(cl_device_id device);
/* The largest group clattn's own kernels may take: the device's under CLATTN_MAX_WORK_GROUP (a
 * malformed cap is reported by the launch, which reads it again). */
size_t clattn__device_max_group(cl_device_id device);
/* CL_DEVICE_LOCAL_MEM_SIZE under CLATTN_MAX_LOCAL_MEMORY (likewise). */
cl_ulong clattn__device_local_bytes(cl_device_id device);
/* CL_DEVICE_MAX_COMPUTE_UNITS, at least 1. */
cl_uint clattn__device_compute_units(cl_device_id device);

#endif
