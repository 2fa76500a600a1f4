#include "device_facts.h"
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

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

cl_ulong clattn__device_cache_bytes(cl_device_id device) {
    cl_ulong bytes = 0;
    clGetDeviceInfo(device, CL_DEVICE_GLOBAL_MEM_CACHE_SIZE, sizeof bytes, &bytes, NULL);
    return bytes;
}

cl_uint clattn__device_base_align_bytes(cl_device_id device) {
    cl_uint bits = 8;
    clGetDeviceInfo(device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof bits, &bits, NULL);
    return bits / 8 ? bits / 8 : 1;
}

bool clattn__device_full_profile(cl_device_id device) {
    char profile[32] = "";
    clGetDeviceInfo(device, CL_DEVICE_PROFILE, sizeof profile - 1, profile, NULL);
    return strcmp(profile, "FULL_PROFILE") == 0;
}

/* "OpenCL 3.0 ..." or "OpenCL C 1.2 ..." -> "3.0", "1.2": the word after `prefix`. */
static void version_of(const char *text, const char *prefix, char *out, size_t capacity) {
    const size_t n = strlen(prefix);
    const char *at = strncmp(text, prefix, n) == 0 ? text + n : text;
    size_t i = 0;
    while (at[i] && at[i] != ' ' && i + 1 < capacity) out[i] = at[i], ++i;
    out[i] = '\0';
}

/* Whether the space-separated list holds `name` as a whole word (a name can be the start of
 * another's). */
static bool extension_listed(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *at = strstr(list, name); at; at = strstr(at + 1, name))
        if ((at == list || at[-1] == ' ') && (at[n] == ' ' || at[n] == '\0')) return true;
    return false;
}

/* CL_DEVICE_EXTENSIONS, whole and terminated, into *all (the caller frees it; NULL where the
 * driver gives none). */
static int extension_list(cl_device_id device, char **all) {
    size_t size = 0;
    *all = NULL;
    if (clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, 0, NULL, &size) != CL_SUCCESS || !size)
        return CLATTN_SUCCESS;
    *all = calloc(size + 1, 1);
    if (!*all) return clattn__fail(CLATTN_ERR_OUT_OF_HOST_MEMORY, "device facts: no memory");
    clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, size, *all, NULL);
    return CLATTN_SUCCESS;
}

bool clattn__device_has_extension(cl_device_id device, const char *name) {
    char *all = NULL;
    const bool has =
        extension_list(device, &all) == CLATTN_SUCCESS && all && extension_listed(all, name);
    free(all);
    return has;
}

/* CL_DEVICE_MAX_NUM_SUB_GROUPS (OpenCL 2.1), which the 1.2 headers clattn builds with lack. */
#define DEVICE_MAX_NUM_SUB_GROUPS 0x105C

int clattn__device_facts_get(cl_device_id device, clattn__device_facts *f) {
    memset(f, 0, sizeof *f);
    char text[256] = "";
    cl_int err = clGetDeviceInfo(device, CL_DEVICE_VERSION, sizeof text, text, NULL);
    if (err != CL_SUCCESS) return clattn__cl_fail(err, "clGetDeviceInfo(CL_DEVICE_VERSION)");
    version_of(text, "OpenCL ", f->opencl, sizeof f->opencl);
    text[0] = '\0';
    clGetDeviceInfo(device, CL_DEVICE_OPENCL_C_VERSION, sizeof text, text, NULL);
    version_of(text, "OpenCL C ", f->opencl_c, sizeof f->opencl_c);
    clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof f->type, &f->type, NULL);
    f->local_bytes = clattn__device_local_bytes(device);
    f->max_group = clattn__device_max_group(device);
    f->compute_units = clattn__device_compute_units(device);
    f->cache_bytes = clattn__device_cache_bytes(device);
    clGetDeviceInfo(device, CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT, sizeof f->vector_float,
                    &f->vector_float, NULL);
    clGetDeviceInfo(device, CL_DEVICE_PREFERRED_VECTOR_WIDTH_HALF, sizeof f->vector_half,
                    &f->vector_half, NULL);
    char *all = NULL;
    const int status = extension_list(device, &all);
    if (status != CLATTN_SUCCESS) return status;
    if (all) {
        f->fp16 = extension_listed(all, "cl_khr_fp16");
        f->fp64 = extension_listed(all, "cl_khr_fp64");
        f->subgroups = extension_listed(all, "cl_khr_subgroups") ||
                       extension_listed(all, "cl_intel_subgroups");
        snprintf(f->extensions, sizeof f->extensions, "%s", all);
        free(all);
    }
    cl_device_fp_config doubles = 0;
    clGetDeviceInfo(device, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof doubles, &doubles, NULL);
    f->fp64 = f->fp64 || doubles != 0;
    cl_uint sub_groups = 0; /* fails before OpenCL 2.1: stays 0 */
    clGetDeviceInfo(device, DEVICE_MAX_NUM_SUB_GROUPS, sizeof sub_groups, &sub_groups, NULL);
    f->subgroups = f->subgroups || sub_groups > 0;
    return CLATTN_SUCCESS;
}

int clattn_device_facts(cl_device_id device, char *text, size_t capacity) {
    clattn__clear_error();
    if (!device || !text || capacity == 0)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                            "clattn_device_facts needs a device and a buffer");
    text[0] = '\0';
    clattn__device_facts f;
    int status = clattn__device_facts_get(device, &f);
    if (status != CLATTN_SUCCESS) return status;
    /* the extensions as one field: names joined by single commas */
    size_t n = 0;
    for (const char *c = f.extensions; *c; ++c)
        if (*c != ' ')
            f.extensions[n++] = *c;
        else if (n > 0 && f.extensions[n - 1] != ',')
            f.extensions[n++] = ',';
    while (n > 0 && f.extensions[n - 1] == ',') --n;
    f.extensions[n] = '\0';
    snprintf(text, capacity,
             "opencl=%s opencl_c=%s local_memory=%llu max_work_group=%zu compute_units=%u "
             "cache=%llu fp16=%s fp64=%s subgroups=%s vector_float=%u vector_half=%u extensions=%s",
             f.opencl, f.opencl_c, (unsigned long long)f.local_bytes, f.max_group, f.compute_units,
             (unsigned long long)f.cache_bytes, f.fp16 ? "yes" : "no", f.fp64 ? "yes" : "no",
             f.subgroups ? "yes" : "no", f.vector_float, f.vector_half, f.extensions);
    return CLATTN_SUCCESS;
}
