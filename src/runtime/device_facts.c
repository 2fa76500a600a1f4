#include "device_facts.h"
#include "config.h"

#include <stdint.h>

size_t clattn__device_group_limit(cl_device_id device) {
    size_t group = 1;
    clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof group, &group, NULL);
    return group;
}

size_t clattn__device_max_group(cl_device_id device) {
    size_t group = clattn__device_group_limit(device), cap = SIZE_MAX;
    if (clattn__group_cap(&cap) == CLATTN_SUCCESS && cap < group) group = cap;
    return group;
}

cl_ulong clattn__device_local_bytes(cl_device_id device) {
    cl_ulong bytes = 0, cap = CL_ULONG_MAX;
    clGetDeviceInfo(device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof bytes, &bytes, NULL);
    if (clattn__local_memory_cap(&cap) == CLATTN_SUCCESS && cap < bytes) bytes = cap;
    return bytes;
}

cl_uint clattn__device_compute_units(cl_device_id device) {
    cl_uint units = 1;
    clGetDeviceInfo(device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL);
    return units ? units : 1;
}
