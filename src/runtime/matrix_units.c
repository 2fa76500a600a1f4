/*
 * Matrix-unit probes. A mechanism counts for a device only when cl/mma.cl's matrix_probe, built
 * for that mechanism, returns the exact product of a known 16 x 16 by 16 x 8 problem there: no
 * vendor names and no driver tables, so an untested driver can never give a wrong result
 * silently. Results are cached per (context, device), the context retained like the program
 * cache's, until clattn_cache_clear.
 */
#include "matrix_units.h"
#include "device_facts.h"
#include "kernel.h"
#include "hooks.h"
#include "launch.h"

#include <CL/cl_ext.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The probe's problem: integers small enough that every product and sum is exact in f16, bf16
 * and f32, so a unit that computes D = A B + C at all gives exactly the host's D. */
#define PROBE_M 16
#define PROBE_N 8
#define PROBE_K 16

static float probe_a(int i, int k) {
    return (float)((i * 3 + k * 5) % 7 - 3);
}
static float probe_b(int k, int j) {
    return (float)((k * 2 + j * 3) % 5 - 2);
}
static float probe_c(int i, int j) {
    return (float)(i - j);
}

/* The 16-bit pattern of a small integer v (|v| < 2048) in f16 or, with bf16, in bf16. */
static cl_ushort small_int_bits(float v, bool bf16) {
    if (bf16) {
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        return (cl_ushort)(bits >> 16); /* exact: a small integer has no low mantissa bits */
    }
    if (v == 0.0f) return 0;
    cl_ushort sign = v < 0 ? 0x8000 : 0;
    unsigned n = (unsigned)(v < 0 ? -v : v), e = 0;
    while ((n >> (e + 1)) != 0) ++e;
    return (cl_ushort)(sign | (e + 15) << 10 | ((n << (10 - e)) & 0x3ffu));
}

/* Runs the probe kernel on one warp of 32 and compares D with the host's product. */
static int run_probe(const clattn__call *call, cl_kernel kernel, bool bf16, bool *exact) {
    cl_ushort a[PROBE_M * PROBE_K], b[PROBE_K * PROBE_N];
    float c[PROBE_M * PROBE_N], d[PROBE_M * PROBE_N], want[PROBE_M * PROBE_N];
    for (int i = 0; i < PROBE_M; ++i)
        for (int k = 0; k < PROBE_K; ++k) a[i * PROBE_K + k] = small_int_bits(probe_a(i, k), bf16);
    for (int k = 0; k < PROBE_K; ++k)
        for (int j = 0; j < PROBE_N; ++j) b[k * PROBE_N + j] = small_int_bits(probe_b(k, j), bf16);
    for (int i = 0; i < PROBE_M; ++i)
        for (int j = 0; j < PROBE_N; ++j) {
            float sum = probe_c(i, j);
            for (int k = 0; k < PROBE_K; ++k) sum += probe_a(i, k) * probe_b(k, j);
            c[i * PROBE_N + j] = probe_c(i, j);
            want[i * PROBE_N + j] = sum;
        }
    cl_int err = CL_SUCCESS;
    const struct {
        void *host;
        size_t bytes;
        cl_mem_flags flags;
    } args[4] = {{a, sizeof a, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR},
                 {b, sizeof b, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR},
                 {c, sizeof c, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR},
                 {NULL, sizeof d, CL_MEM_WRITE_ONLY}};
    cl_mem buffers[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4 && err == CL_SUCCESS; ++i)
        buffers[i] =
            clCreateBuffer(call->context, args[i].flags, args[i].bytes, args[i].host, &err);
    int status = err == CL_SUCCESS ? CLATTN_SUCCESS : clattn__cl_fail(err, "probe buffers");
    for (cl_uint i = 0; i < 4 && status == CLATTN_SUCCESS; ++i)
        status = clattn__set_arg(kernel, i, sizeof(cl_mem), &buffers[i]);
    const size_t warp = 32;
    cl_event done = NULL; /* the read waits for it: the caller's queue may be out of order */
    if (status == CLATTN_SUCCESS) {
        err = clEnqueueNDRangeKernel(call->queue, kernel, 1, NULL, &warp, &warp, 0, NULL, &done);
        if (err == CL_SUCCESS)
            err = clEnqueueReadBuffer(call->queue, buffers[3], CL_TRUE, 0, sizeof d, d, 1, &done,
                                      NULL);
        if (err != CL_SUCCESS) status = clattn__cl_fail(err, "the matrix-unit probe");
    }
    if (done) clReleaseEvent(done);
    for (int i = 0; i < 4; ++i)
        if (buffers[i]) clReleaseMemObject(buffers[i]);
    *exact = status == CLATTN_SUCCESS;
    for (int i = 0; i < PROBE_M * PROBE_N && *exact; ++i) *exact = d[i] == want[i];
    return status;
}

int clattn__matrix_probe(const clattn__call *call, const char *options, bool *exact) {
    *exact = false;
    cl_device_id device = call->device;
    cl_kernel kernel = NULL;
    int status =
        clattn__create_kernel(call->context, device, "mma.cl", options, "matrix_probe", &kernel);
    if (status == CLATTN_ERR_BUILD_FAILED) return CLATTN_SUCCESS; /* not this mechanism */
    size_t max_group = 0; /* a warp must fit one group, under CLATTN_MAX_WORK_GROUP too */
    if (status == CLATTN_SUCCESS) status = clattn__kernel_max_group(kernel, device, &max_group);
    if (status == CLATTN_SUCCESS && max_group >= 32)
        status = run_probe(call, kernel, strstr(options, "bf16") != NULL, exact);
    if (kernel) clReleaseKernel(kernel);
    return status;
}

/* A device is handed inline PTX only when it says it is a CUDA device of compute capability 8.0
 * or more (cl_nv_device_attribute_query; mma.m16n8k16 needs sm_80): another compiler given PTX
 * could fail in ways no build log reports (an LLVM backend may abort on an instruction it does
 * not know). The probe then decides. */
static bool takes_ptx_mma(cl_device_id device) {
    clattn__device_facts facts;
    if (clattn__device_facts_get(device, &facts) != CLATTN_SUCCESS) return false;
    if (!strstr(facts.extensions, "cl_nv_device_attribute_query")) return false;
    cl_uint major = 0;
    return clGetDeviceInfo(device, CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, sizeof major, &major,
                           NULL) == CL_SUCCESS &&
           major >= 8;
}

/* The mechanisms: a unit, its probe's input type, and the test a device must pass before the
 * probe is built at all. */
static const struct {
    unsigned unit;
    const char *type;
    bool (*offered)(cl_device_id);
} mechanisms[] = {
    {CLATTN_MATRIX_MMA_F16, "f16", takes_ptx_mma},
    {CLATTN_MATRIX_MMA_BF16, "bf16", takes_ptx_mma},
};

bool clattn__matrix_units_emulated(void) {
    return clattn__hook_value(CLATTN__HOOK_MATRIX_EMULATION) == 1;
}

/* A mechanism's probe: the PTX build, or with the emulation hook (tests) the local-memory
 * emulation, offered to every device. */
static int probe_mechanism(const clattn__call *call, size_t i, bool *exact) {
    const bool emulated = clattn__matrix_units_emulated();
    *exact = false;
    if (!emulated && !mechanisms[i].offered(call->device)) return CLATTN_SUCCESS;
    char options[128];
    snprintf(options, sizeof options, "-cl-std=CL1.2 -DMMA_PROBE=1 -DMMA_PTX=%d -DMMA_T=%s",
             emulated ? 0 : 1, mechanisms[i].type);
    return clattn__matrix_probe(call, options, exact);
}

typedef struct probe_entry {
    cl_context context;
    cl_device_id device;
    unsigned units;
    struct probe_entry *next;
} probe_entry;
static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;
static probe_entry *probe_head;

static bool cached_units(cl_context context, cl_device_id device, unsigned *units) {
    pthread_mutex_lock(&probe_lock);
    const probe_entry *e = probe_head;
    while (e && (e->context != context || e->device != device)) e = e->next;
    if (e) *units = e->units;
    pthread_mutex_unlock(&probe_lock);
    return e != NULL;
}

/* Two threads may probe the same device at once; both get the same answer, the first is kept. */
static void cache_units(cl_context context, cl_device_id device, unsigned units) {
    probe_entry *e = malloc(sizeof *e);
    if (!e) return; /* the next call probes again */
    pthread_mutex_lock(&probe_lock);
    const probe_entry *known = probe_head;
    while (known && (known->context != context || known->device != device)) known = known->next;
    if (known) {
        free(e);
    } else {
        clRetainContext(context);
        *e = (probe_entry){context, device, units, probe_head};
        probe_head = e;
    }
    pthread_mutex_unlock(&probe_lock);
}

void clattn__matrix_units_clear(cl_context context) {
    pthread_mutex_lock(&probe_lock);
    probe_entry **link = &probe_head;
    while (*link) {
        probe_entry *e = *link;
        if (!context || e->context == context) {
            *link = e->next;
            clReleaseContext(e->context);
            free(e);
        } else {
            link = &e->next;
        }
    }
    pthread_mutex_unlock(&probe_lock);
}

int clattn__matrix_units(const clattn__call *call, unsigned *units) {
    *units = 0;
    int status = CLATTN_SUCCESS;
    if (cached_units(call->context, call->device, units)) return status;
    unsigned found = 0;
    for (size_t i = 0; i < sizeof mechanisms / sizeof mechanisms[0] && status == CLATTN_SUCCESS;
         ++i) {
        bool exact = false;
        status = probe_mechanism(call, i, &exact);
        if (exact) found |= mechanisms[i].unit;
    }
    if (status != CLATTN_SUCCESS) return status;
    cache_units(call->context, call->device, found);
    *units = found;
    return CLATTN_SUCCESS;
}

int clattn_matrix_units(cl_command_queue queue, unsigned *units) {
    clattn__clear_error();
    if (!queue || !units)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "clattn_matrix_units needs a queue and "
                                                         "a place for the units");
    clattn__call call;
    int status = clattn__begin_call(&call, queue, 0, NULL, NULL);
    return status == CLATTN_SUCCESS ? clattn__matrix_units(&call, units) : status;
}
