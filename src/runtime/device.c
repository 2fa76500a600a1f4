/* Device listing and selection (CLATTN_DEVICE), and the clattn_env convenience. */
#include "launch.h"
#include "status.h"
#include "tensor.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* The ICD loader's answer when no platform is installed (cl_khr_icd). */
#ifndef CL_PLATFORM_NOT_FOUND_KHR
#define CL_PLATFORM_NOT_FOUND_KHR -1001
#endif

#define CLATTN_MAX_PLATFORMS            16
#define CLATTN_MAX_DEVICES_PER_PLATFORM 64

static void device_string(cl_device_id device, cl_device_info what, char *out, size_t capacity) {
    out[0] = '\0';
    if (clGetDeviceInfo(device, what, capacity, out, NULL) != CL_SUCCESS) out[0] = '\0';
    out[capacity - 1] = '\0';
}

static void describe(int p, int d, cl_platform_id platform, cl_device_id device,
                     clattn_device_desc *out) {
    memset(out, 0, sizeof *out);
    out->platform_index = p;
    out->device_index = d;
    out->platform = platform;
    out->device = device;
    clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof out->type, &out->type, NULL);
    if (clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof out->platform_name, out->platform_name,
                          NULL) != CL_SUCCESS)
        out->platform_name[0] = '\0';
    out->platform_name[sizeof out->platform_name - 1] = '\0';
    device_string(device, CL_DEVICE_NAME, out->name, sizeof out->name);
    device_string(device, CL_DEVICE_VENDOR, out->vendor, sizeof out->vendor);
    device_string(device, CL_DEVICE_VERSION, out->version, sizeof out->version);
    device_string(device, CL_DRIVER_VERSION, out->driver, sizeof out->driver);
}

/* Calls visit() for every device of every platform until it returns non-zero. A platform with no
 * devices (clGetDeviceIDs says CL_DEVICE_NOT_FOUND) is skipped, not an error. */
typedef int (*device_visitor)(const clattn_device_desc *desc, void *user);

static int for_each_device(device_visitor visit, void *user) {
    cl_platform_id platforms[CLATTN_MAX_PLATFORMS];
    cl_uint num_platforms = 0;
    cl_int err = clGetPlatformIDs(CLATTN_MAX_PLATFORMS, platforms, &num_platforms);
    if (err == CL_PLATFORM_NOT_FOUND_KHR || num_platforms == 0) return CLATTN_SUCCESS;
    if (err != CL_SUCCESS) return clattn__cl_fail(err, "clGetPlatformIDs");
    if (num_platforms > CLATTN_MAX_PLATFORMS) num_platforms = CLATTN_MAX_PLATFORMS;
    for (cl_uint p = 0; p < num_platforms; ++p) {
        cl_device_id devices[CLATTN_MAX_DEVICES_PER_PLATFORM];
        cl_uint num_devices = 0;
        err = clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, CLATTN_MAX_DEVICES_PER_PLATFORM,
                             devices, &num_devices);
        if (err == CL_DEVICE_NOT_FOUND) continue;
        if (err != CL_SUCCESS) return clattn__cl_fail(err, "clGetDeviceIDs");
        if (num_devices > CLATTN_MAX_DEVICES_PER_PLATFORM)
            num_devices = CLATTN_MAX_DEVICES_PER_PLATFORM;
        for (cl_uint d = 0; d < num_devices; ++d) {
            clattn_device_desc desc;
            describe((int)p, (int)d, platforms[p], devices[d], &desc);
            if (visit(&desc, user)) return CLATTN_SUCCESS;
        }
    }
    return CLATTN_SUCCESS;
}

typedef struct list_state {
    clattn_device_desc *out;
    size_t capacity, count;
} list_state;

static int list_visit(const clattn_device_desc *desc, void *user) {
    list_state *s = user;
    if (s->count < s->capacity) s->out[s->count] = *desc;
    ++s->count;
    return 0;
}

int clattn_list_devices(clattn_device_desc *out, size_t capacity, size_t *count) {
    clattn__clear_error();
    if (!count || (capacity > 0 && !out))
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_list_devices: NULL output");
    list_state s = {out, capacity, 0};
    int status = for_each_device(list_visit, &s);
    *count = s.count;
    return status;
}

/* ---- selection ---- */

typedef struct select_state {
    const char *spec; /* NULL: default rule */
    int want_platform, want_device;
    bool by_index;
    bool found, found_gpu;
    clattn_device_desc first, first_gpu, match;
} select_state;

static bool contains_nocase(const char *haystack, const char *needle) {
    size_t n = strlen(needle);
    for (const char *h = haystack; *h; ++h) {
        size_t i = 0;
        while (i < n && h[i] && tolower((unsigned char)h[i]) == tolower((unsigned char)needle[i]))
            ++i;
        if (i == n) return true;
    }
    return n == 0;
}

static int select_visit(const clattn_device_desc *desc, void *user) {
    select_state *s = user;
    if (!s->spec) {
        if (!s->found) s->first = *desc;
        s->found = true;
        if (desc->type & CL_DEVICE_TYPE_GPU) {
            s->first_gpu = *desc;
            s->found_gpu = true;
            return 1;
        }
        return 0;
    }
    bool hit =
        s->by_index
            ? desc->platform_index == s->want_platform && desc->device_index == s->want_device
            : contains_nocase(desc->platform_name, s->spec) || contains_nocase(desc->name, s->spec);
    if (hit) {
        s->match = *desc;
        s->found = true;
    }
    return hit;
}

/* "P:D" with both parts decimal. Returns false when the spec is not of that form. */
static bool parse_index_spec(const char *spec, int *platform, int *device, bool *malformed) {
    *malformed = false;
    const char *colon = strchr(spec, ':');
    if (!colon || !isdigit((unsigned char)spec[0])) return false;
    char *end = NULL;
    long p = strtol(spec, &end, 10);
    if (end != colon || !isdigit((unsigned char)colon[1])) {
        *malformed = true;
        return false;
    }
    long d = strtol(colon + 1, &end, 10);
    if (*end != '\0' || p > 1000 || d > 1000) {
        *malformed = true;
        return false;
    }
    *platform = (int)p;
    *device = (int)d;
    return true;
}

int clattn_select_device(const char *spec, clattn_device_desc *out) {
    clattn__clear_error();
    if (!out) return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_select_device: out is NULL");
    if (!spec || !*spec) spec = getenv("CLATTN_DEVICE");
    if (spec && !*spec) spec = NULL;

    select_state s = {0};
    s.spec = spec;
    if (spec) {
        bool malformed = false;
        s.by_index = parse_index_spec(spec, &s.want_platform, &s.want_device, &malformed);
        if (malformed)
            return clattn__fail(CLATTN_ERR_INVALID_DEVICE_SPEC,
                                "device spec \"%s\": expected P:D (two indices) or a name", spec);
    }
    int status = for_each_device(select_visit, &s);
    if (status != CLATTN_SUCCESS) return status;
    if (!s.found)
        return clattn__fail(CLATTN_ERR_DEVICE_NOT_FOUND,
                            spec ? "no OpenCL device matches \"%s\" (see clinfo -l)"
                                 : "no OpenCL device found%s (is an ICD such as pocl-opencl-icd "
                                   "installed?)",
                            spec ? spec : "");
    *out = spec ? s.match : s.found_gpu ? s.first_gpu : s.first;
    return CLATTN_SUCCESS;
}

/* ---- the convenience environment ---- */

struct clattn_env {
    clattn_device_desc desc;
    cl_context context;
    cl_command_queue queue;
    bool wrapped; /* the caller's queue: its context's programs stay cached at release */
};

int clattn_env_create(const char *spec, clattn_env **out) {
    if (!out) return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_env_create: out is NULL");
    *out = NULL;
    clattn_env *env = calloc(1, sizeof *env);
    if (!env) return clattn__fail(CLATTN_ERR_OUT_OF_HOST_MEMORY, "no memory for clattn_env");
    int status = clattn_select_device(spec, &env->desc);
    if (status != CLATTN_SUCCESS) {
        free(env);
        return status;
    }
    cl_int err;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)env->desc.platform,
                                     0};
    env->context = clCreateContext(props, 1, &env->desc.device, NULL, NULL, &err);
    if (err != CL_SUCCESS) {
        free(env);
        return clattn__cl_fail(err, "clCreateContext");
    }
    /* Profiling is on so that a caller (the benchmark) can time kernels by their events. */
    env->queue =
        clCreateCommandQueue(env->context, env->desc.device, CL_QUEUE_PROFILING_ENABLE, &err);
    if (err != CL_SUCCESS) {
        clReleaseContext(env->context);
        free(env);
        return clattn__cl_fail(err, "clCreateCommandQueue");
    }
    *out = env;
    return CLATTN_SUCCESS;
}

typedef struct find_state {
    cl_device_id device;
    clattn_device_desc desc;
    bool found;
} find_state;

static int find_visit(const clattn_device_desc *desc, void *user) {
    find_state *s = user;
    if (desc->device != s->device) return 0;
    s->desc = *desc;
    s->found = true;
    return 1;
}

/* The queue's device as clattn_list_devices describes it; a device no platform lists (a
 * sub-device) keeps indices -1. */
static int describe_queue_device(cl_command_queue queue, cl_context *context,
                                 clattn_device_desc *out) {
    cl_device_id device;
    cl_int err = clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof device, &device, NULL);
    if (err == CL_SUCCESS)
        err = clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof *context, context, NULL);
    if (err != CL_SUCCESS) return clattn__cl_fail(err, "clGetCommandQueueInfo");
    find_state s = {.device = device};
    int status = for_each_device(find_visit, &s);
    if (status != CLATTN_SUCCESS) return status;
    if (s.found) {
        *out = s.desc;
        return CLATTN_SUCCESS;
    }
    cl_platform_id platform;
    err = clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL);
    if (err != CL_SUCCESS) return clattn__cl_fail(err, "clGetDeviceInfo");
    describe(-1, -1, platform, device, out);
    return CLATTN_SUCCESS;
}

int clattn_env_wrap(cl_command_queue queue, clattn_env **out) {
    clattn__clear_error();
    if (!out) return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_env_wrap: out is NULL");
    *out = NULL;
    if (!queue) return clattn__cl_fail(CL_INVALID_COMMAND_QUEUE, "clattn_env_wrap: NULL queue");
    clattn_env *env = calloc(1, sizeof *env);
    if (!env) return clattn__fail(CLATTN_ERR_OUT_OF_HOST_MEMORY, "no memory for clattn_env");
    int status = describe_queue_device(queue, &env->context, &env->desc);
    if (status != CLATTN_SUCCESS) {
        free(env);
        return status;
    }
    clRetainCommandQueue(queue);
    clRetainContext(env->context);
    env->queue = queue;
    env->wrapped = true;
    *out = env;
    return CLATTN_SUCCESS;
}

void clattn_env_release(clattn_env *env) {
    if (!env) return;
    clFinish(env->queue);
    clReleaseCommandQueue(env->queue);
    if (!env->wrapped) clattn_cache_clear(env->context);
    clReleaseContext(env->context);
    free(env);
}

cl_context clattn_env_context(const clattn_env *env) {
    return env ? env->context : NULL;
}

cl_command_queue clattn_env_queue(const clattn_env *env) {
    return env ? env->queue : NULL;
}

cl_device_id clattn_env_device(const clattn_env *env) {
    return env ? env->desc.device : NULL;
}

const clattn_device_desc *clattn_env_device_desc(const clattn_env *env) {
    return env ? &env->desc : NULL;
}

int clattn_env_alloc(clattn_env *env, clattn_dtype dtype, const int64_t shape[4],
                     clattn_tensor *out) {
    clattn__clear_error();
    if (!env || !shape || !out)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_env_alloc: NULL argument");
    memset(out, 0, sizeof *out);
    if (clattn_dtype_size(dtype) == 0)
        return clattn__fail(CLATTN_ERR_UNSUPPORTED_DTYPE, "clattn_env_alloc: unknown dtype %d",
                            (int)dtype);
    clattn_tensor t = clattn_tensor_4d(NULL, dtype, shape[0], shape[1], shape[2], shape[3]);
    uint64_t count = 1;
    for (int i = 0; i < 4; ++i) {
        if (shape[i] <= 0)
            return clattn__fail(CLATTN_ERR_INVALID_SHAPE, "clattn_env_alloc: shape[%d] = %lld", i,
                                (long long)shape[i]);
        if (__builtin_mul_overflow(count, (uint64_t)shape[i], &count) ||
            count > ((uint64_t)1 << 40))
            return clattn__fail(CLATTN_ERR_DEVICE_LIMIT, "clattn_env_alloc: too many elements");
    }
    cl_int err;
    t.buffer = clCreateBuffer(env->context, CL_MEM_READ_WRITE, count * clattn_dtype_size(dtype),
                              NULL, &err);
    if (err != CL_SUCCESS) return clattn__cl_fail(err, "clCreateBuffer");
    *out = t;
    return CLATTN_SUCCESS;
}

void clattn_tensor_free(clattn_tensor *t) {
    if (!t) return;
    if (t->buffer) clReleaseMemObject(t->buffer);
    memset(t, 0, sizeof *t);
}

static bool is_contiguous(const clattn_tensor *t) {
    clattn_tensor dense =
        clattn_tensor_4d(t->buffer, t->dtype, t->shape[0], t->shape[1], t->shape[2], t->shape[3]);
    for (int i = 0; i < 4; ++i)
        if (t->shape[i] > 1 && t->strides[i] != dense.strides[i]) return false;
    return true;
}

static int transfer(clattn_env *env, const clattn_tensor *t, void *host, bool upload) {
    clattn__clear_error();
    if (!env || !t || !host)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_env_%s: NULL argument",
                            upload ? "upload" : "download");
    int status = clattn__check_tensor("tensor", t, env->context, 0xffu, upload);
    if (status != CLATTN_SUCCESS) return status;
    if (!is_contiguous(t))
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                            "clattn_env_%s: the tensor must be contiguous (use clattn_copy first)",
                            upload ? "upload" : "download");
    size_t elem = clattn_dtype_size(t->dtype);
    size_t bytes = (size_t)clattn_tensor_numel(t) * elem;
    /* A wrapped out-of-order queue: the copy comes after everything enqueued before it, as on
     * the in-order queue of clattn_env_create. */
    cl_int err = clattn__queue_out_of_order(env->queue)
                     ? clEnqueueBarrierWithWaitList(env->queue, 0, NULL, NULL)
                     : CL_SUCCESS;
    if (err != CL_SUCCESS) return clattn__cl_fail(err, "clEnqueueBarrierWithWaitList");
    err = upload ? clEnqueueWriteBuffer(env->queue, t->buffer, CL_TRUE, t->offset * elem, bytes,
                                        host, 0, NULL, NULL)
                 : clEnqueueReadBuffer(env->queue, t->buffer, CL_TRUE, t->offset * elem, bytes,
                                       host, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        return clattn__cl_fail(err, upload ? "clEnqueueWriteBuffer" : "clEnqueueReadBuffer");
    return CLATTN_SUCCESS;
}

int clattn_env_upload(clattn_env *env, const clattn_tensor *t, const void *host) {
    return transfer(env, t, (void *)host, true);
}

int clattn_env_download(clattn_env *env, const clattn_tensor *t, void *host) {
    return transfer(env, t, host, false);
}
