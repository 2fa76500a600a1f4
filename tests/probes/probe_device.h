/* The device a probe asks about, by its platform's and its own name (CL_PLATFORM_NAME,
 * CL_DEVICE_NAME, both exact), for the driver checks of tests/probes, which stay plain OpenCL. */
#ifndef CLATTN_PROBE_DEVICE_H
#define CLATTN_PROBE_DEVICE_H

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <string.h>

static cl_device_id find_device(const char *platform_name, const char *device_name) {
    cl_platform_id platforms[16];
    cl_uint np = 0;
    if (clGetPlatformIDs(16, platforms, &np) != CL_SUCCESS) return NULL;
    for (cl_uint p = 0; p < np && p < 16; ++p) {
        char name[256] = "";
        clGetPlatformInfo(platforms[p], CL_PLATFORM_NAME, sizeof name, name, NULL);
        if (strcmp(name, platform_name) != 0) continue;
        cl_device_id devices[16];
        cl_uint nd = 0;
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 16, devices, &nd) != CL_SUCCESS)
            continue;
        for (cl_uint d = 0; d < nd && d < 16; ++d) {
            clGetDeviceInfo(devices[d], CL_DEVICE_NAME, sizeof name, name, NULL);
            if (strcmp(name, device_name) == 0) return devices[d];
        }
    }
    return NULL;
}

#endif
