/*
 * Matrix-unit probes. A mechanism counts for a device only when cl/mma.cl's probes, built for
 * that mechanism, return the exact products of a known problem there (tile_probe: 16 x 16 by
 * 16 x 16 with b in both layouts; for NVIDIA's also matrix_probe, the warp primitives
 * attention_mma uses): no vendor names and no driver tables, so an untested driver can never
 * give a wrong result silently. Results are cached per (context, device), the context retained
 * like the program cache's, until clattn_cache_clear.
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

/* A probe kernel's problem: D = A B + C, A 16 x 16, B 16 x n (n 8: matrix_probe; 16: tile_probe,
 * which returns D twice, b loaded in each layout), the work-group one subgroup; or tf32_probe's
 * (probe_tf32 below). */
typedef struct probe_shape {
    const char *kernel;
    int n, copies;
} probe_shape;
static const probe_shape matrix_probe_shape = {"matrix_probe", 8, 1},
                         tile_probe_shape = {"tile_probe", 16, 2},
                         tf32_probe_shape = {"tf32_probe", 8, 2};

/* A probe's inputs (host arrays, in the kernel's argument order, before its output) and the
 * outputs it must return exactly. */
enum { PROBE_MAX_INPUTS = 5, PROBE_MAX_OUT = 2 * PROBE_M * 16 };
typedef struct probe_problem {
    const void *inputs[PROBE_MAX_INPUTS];
    size_t bytes[PROBE_MAX_INPUTS];
    int count, out;
    float want[PROBE_MAX_OUT];
} probe_problem;

static void probe_input(probe_problem *p, const void *host, size_t bytes) {
    p->inputs[p->count] = host, p->bytes[p->count] = bytes, ++p->count;
}

/* Runs a probe kernel on one subgroup of `group` work-items and compares its output with the
 * problem's, on a queue of its own: the caller's may hold work that waits for events the caller
 * sets only after the call returns (a user event, a marker), and the probe's blocking read
 * would wait behind it. */
static int run_probe(const clattn__call *call, cl_kernel kernel, const probe_problem *p,
                     size_t group, bool *exact) {
    float d[PROBE_MAX_OUT];
    const size_t out = (size_t)p->out * sizeof(float);
    cl_int err = CL_SUCCESS;
    *exact = false;
    cl_command_queue queue = clCreateCommandQueue(call->context, call->device, 0, &err);
    if (err != CL_SUCCESS) return clattn__cl_fail(err, "clCreateCommandQueue (matrix-unit probe)");
    cl_mem buffers[PROBE_MAX_INPUTS + 1] = {NULL};
    for (int i = 0; i <= p->count && err == CL_SUCCESS; ++i)
        buffers[i] = i < p->count
                         ? clCreateBuffer(call->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                          p->bytes[i], (void *)p->inputs[i], &err)
                         : clCreateBuffer(call->context, CL_MEM_WRITE_ONLY, out, NULL, &err);
    int status = err == CL_SUCCESS ? CLATTN_SUCCESS : clattn__cl_fail(err, "probe buffers");
    for (int i = 0; i <= p->count && status == CLATTN_SUCCESS; ++i)
        status = clattn__set_buffer_arg(kernel, (cl_uint)i, buffers[i]);
    bool launched = false;
    if (status == CLATTN_SUCCESS) status = clattn__args_complete(kernel);
    if (status == CLATTN_SUCCESS) {
        /* a probe that built but does not launch here (a group or resource its compiler cannot
         * run) means no unit, as a failed build does; a failed read is the queue's error */
        launched = clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &group, &group, 0, NULL, NULL) ==
                   CL_SUCCESS;
        err = launched
                  ? clEnqueueReadBuffer(queue, buffers[p->count], CL_TRUE, 0, out, d, 0, NULL, NULL)
                  : CL_SUCCESS;
        if (err != CL_SUCCESS) status = clattn__cl_fail(err, "reading the matrix-unit probe");
    }
    for (int i = 0; i <= p->count; ++i)
        if (buffers[i]) clReleaseMemObject(buffers[i]);
    clReleaseCommandQueue(queue);
    *exact = status == CLATTN_SUCCESS && launched;
    for (int i = 0; i < p->out && *exact; ++i) *exact = d[i] == p->want[i];
    return status;
}

/* The 16-bit probes' problem (matrix_probe, tile_probe): A and B as small integers in f16 or
 * bf16, C as floats, D `shape->copies` times. The arrays live in `store`. */
typedef struct probe_store {
    cl_ushort a[PROBE_M * PROBE_K], b[PROBE_K * 16];
    float fa[2][PROBE_M * 8], fb[2][8 * 8], c[PROBE_M * 16];
} probe_store;

static void probe_16bit(const probe_shape *shape, bool bf16, probe_store *st, probe_problem *p) {
    const int n = shape->n;
    for (int i = 0; i < PROBE_M; ++i)
        for (int k = 0; k < PROBE_K; ++k)
            st->a[i * PROBE_K + k] = small_int_bits(probe_a(i, k), bf16);
    for (int k = 0; k < PROBE_K; ++k)
        for (int j = 0; j < n; ++j) st->b[k * n + j] = small_int_bits(probe_b(k, j), bf16);
    *p = (probe_problem){.out = shape->copies * PROBE_M * n};
    for (int i = 0; i < PROBE_M; ++i)
        for (int j = 0; j < n; ++j) {
            float sum = probe_c(i, j);
            for (int k = 0; k < PROBE_K; ++k) sum += probe_a(i, k) * probe_b(k, j);
            st->c[i * n + j] = probe_c(i, j);
            for (int copy = 0; copy < shape->copies; ++copy)
                p->want[copy * PROBE_M * n + i * n + j] = sum;
        }
    probe_input(p, st->a, sizeof st->a);
    probe_input(p, st->b, PROBE_K * (size_t)n * sizeof(cl_ushort));
    probe_input(p, st->c, PROBE_M * (size_t)n * sizeof(float));
}

/* tf32_probe's problem (cl/mma.cl): D = A B + C (A 16 x 8, B 8 x 8) for A of integers of 14 to
 * 16 bits and B of up to 2 bits (its small parts 0), then for A2 of up to 2 bits and B2 of up to
 * 16, so that each product's small parts matter (11 bits are tf32's), and every product and sum
 * is exact in f32. */
static void probe_tf32(probe_store *st, probe_problem *p) {
    *p = (probe_problem){.out = 2 * PROBE_M * 8};
    for (int i = 0; i < PROBE_M; ++i)
        for (int k = 0; k < 8; ++k) {
            st->fa[0][i * 8 + k] = (float)(40961 + 1021 * i - 4093 * k); /* 14 to 16 bits */
            st->fa[1][i * 8 + k] = probe_a(i, k);
        }
    for (int k = 0; k < 8; ++k)
        for (int j = 0; j < 8; ++j) {
            st->fb[0][k * 8 + j] = probe_b(k, j);
            st->fb[1][k * 8 + j] = (float)(-65535 + 2049 * k + 4099 * j);
        }
    for (int copy = 0; copy < 2; ++copy)
        for (int i = 0; i < PROBE_M; ++i)
            for (int j = 0; j < 8; ++j) {
                float sum = probe_c(i, j);
                for (int k = 0; k < 8; ++k)
                    sum += st->fa[copy][i * 8 + k] * st->fb[copy][k * 8 + j];
                st->c[i * 8 + j] = probe_c(i, j);
                p->want[copy * PROBE_M * 8 + i * 8 + j] = sum;
            }
    probe_input(p, st->fa[0], sizeof st->fa[0]);
    probe_input(p, st->fb[0], sizeof st->fb[0]);
    probe_input(p, st->fa[1], sizeof st->fa[1]);
    probe_input(p, st->fb[1], sizeof st->fb[1]);
    probe_input(p, st->c, PROBE_M * 8 * sizeof(float));
}

/* Builds the probe program with `options` (a build failure: not exact, no error) and runs the
 * named kernel where its group of `group` work-items fits. */
static int probe_kernel(const clattn__call *call, const char *options, const probe_shape *shape,
                        size_t group, bool *exact) {
    *exact = false;
    cl_device_id device = call->device;
    cl_kernel kernel = NULL;
    int status =
        clattn__create_kernel(call->context, device, "mma.cl", options, shape->kernel, &kernel);
    if (status == CLATTN_ERR_BUILD_FAILED) return CLATTN_SUCCESS; /* not this mechanism */
    size_t max_group = 0; /* the subgroup must fit one group, under CLATTN_MAX_WORK_GROUP too */
    if (status == CLATTN_SUCCESS) status = clattn__kernel_max_group(kernel, device, &max_group);
    probe_store store;
    probe_problem problem;
    if (shape == &tf32_probe_shape)
        probe_tf32(&store, &problem);
    else
        probe_16bit(shape, strstr(options, "bf16") != NULL, &store, &problem);
    if (status == CLATTN_SUCCESS && max_group >= group)
        status = run_probe(call, kernel, &problem, group, exact);
    clattn__release_kernel(kernel);
    return status;
}

int clattn__matrix_probe(const clattn__call *call, const char *options, bool *exact) {
    return probe_kernel(call, options, &matrix_probe_shape, 32, exact);
}

int clattn__tile_probe(const clattn__call *call, const char *options, int subgroup, bool *exact) {
    return probe_kernel(call, options, &tile_probe_shape, (size_t)subgroup, exact);
}

int clattn__tf32_probe(const clattn__call *call, const char *options, bool *exact) {
    return probe_kernel(call, options, &tf32_probe_shape, 32, exact);
}

/* A device is handed inline PTX only when it says it is a CUDA device of compute capability 8.0
 * or more (cl_nv_device_attribute_query; mma.m16n8k16 needs sm_80): another compiler given PTX
 * could fail in ways no build log reports (an LLVM backend may abort on an instruction it does
 * not know). The probe then decides. */
static bool takes_ptx_mma(cl_device_id device) {
    if (!clattn__device_has_extension(device, "cl_nv_device_attribute_query")) return false;
    cl_uint major = 0;
    return clGetDeviceInfo(device, CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, sizeof major, &major,
                           NULL) == CL_SUCCESS &&
           major >= 8;
}

/* The GPU architecture an AMD device names (CL_DEVICE_NAME: "gfx1100", "gfx90a:sramecc+:xnack-")
 * starts with one of `isas`: AMD's compiler aborts in its back end, rather than failing the
 * build, on a matrix builtin the GPU lacks (WMMA's gfx11 form on gfx12 does), so a builtin goes
 * only to the architectures that have it, as PTX goes only to compute capability 8.0 and on. */
static bool amd_isa_is(cl_device_id device, const char *const *isas) {
    if (!clattn__device_has_extension(device, "cl_amd_device_attribute_query")) return false;
    char name[256] = "";
    if (clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof name - 1, name, NULL) != CL_SUCCESS)
        return false;
    for (; *isas; ++isas)
        if (strncmp(name, *isas, strlen(*isas)) == 0) return true;
    return false;
}
/* v_wmma_f32_16x16x16_{f16,bf16} with the _w32 builtins: RDNA3 (gfx11). */
static bool takes_amd_wmma(cl_device_id device) {
    static const char *const isas[] = {"gfx11", NULL};
    return amd_isa_is(device, isas);
}
/* v_mfma_f32_16x16x16f16 and 16x16x16bf16_1k: CDNA2 and on (gfx90a, gfx94x, gfx95x). */
static bool takes_amd_mfma(cl_device_id device) {
    static const char *const isas[] = {"gfx90a", "gfx94", "gfx95", NULL};
    return amd_isa_is(device, isas);
}

/* Intel's dpas needs the subgroup width the builtins are defined for: the device's smallest
 * (the extension: "the subgroup size must be the minimum supported subgroup size"). */
static bool takes_dpas(cl_device_id device, size_t width) {
    if (!clattn__device_has_extension(device, "cl_intel_subgroup_matrix_multiply_accumulate"))
        return false;
    size_t sizes[16] = {0}, bytes = 0;
    if (clGetDeviceInfo(device, CL_DEVICE_SUB_GROUP_SIZES_INTEL, sizeof sizes, sizes, &bytes) !=
            CL_SUCCESS ||
        bytes < sizeof sizes[0])
        return false;
    size_t least = sizes[0];
    for (size_t i = 1; i < bytes / sizeof sizes[0] && i < 16; ++i)
        if (sizes[i] < least) least = sizes[i];
    return least == width;
}
static bool takes_dpas8(cl_device_id device) {
    return takes_dpas(device, 8);
}
static bool takes_dpas16(cl_device_id device) {
    return takes_dpas(device, 16);
}

/* The mechanisms, in the order kernels prefer them: a unit and its name, its probe's input type,
 * its subgroup tile (cl/mma.cl's MMA_UNIT and MMA_SG), and the test a device must pass before
 * the probe is built at all. */
static const struct mechanism {
    unsigned unit;
    const char *name;
    clattn_dtype type;
    clattn__tile tile;
    bool (*offered)(cl_device_id);
} mechanisms[] = {
    {CLATTN_MATRIX_MMA_F16, "mma-f16", CLATTN_F16, {CLATTN__TILE_NV, 32}, takes_ptx_mma},
    {CLATTN_MATRIX_MMA_BF16, "mma-bf16", CLATTN_BF16, {CLATTN__TILE_NV, 32}, takes_ptx_mma},
    {CLATTN_MATRIX_WMMA_F16, "wmma-f16", CLATTN_F16, {CLATTN__TILE_WMMA, 32}, takes_amd_wmma},
    {CLATTN_MATRIX_WMMA_BF16, "wmma-bf16", CLATTN_BF16, {CLATTN__TILE_WMMA, 32}, takes_amd_wmma},
    {CLATTN_MATRIX_MFMA_F16, "mfma-f16", CLATTN_F16, {CLATTN__TILE_MFMA, 64}, takes_amd_mfma},
    {CLATTN_MATRIX_MFMA_BF16, "mfma-bf16", CLATTN_BF16, {CLATTN__TILE_MFMA, 64}, takes_amd_mfma},
    {CLATTN_MATRIX_DPAS_F16, "dpas-f16", CLATTN_F16, {CLATTN__TILE_DPAS8, 8}, takes_dpas8},
    {CLATTN_MATRIX_DPAS_BF16, "dpas-bf16", CLATTN_BF16, {CLATTN__TILE_DPAS8, 8}, takes_dpas8},
    {CLATTN_MATRIX_DPAS_F16, "dpas-f16", CLATTN_F16, {CLATTN__TILE_DPAS16, 16}, takes_dpas16},
    {CLATTN_MATRIX_DPAS_BF16, "dpas-bf16", CLATTN_BF16, {CLATTN__TILE_DPAS16, 16}, takes_dpas16},
    /* f32 on the tf32 unit: the warp's 3xTF32 products (attention_mma, matmul_mma) */
    {CLATTN_MATRIX_MMA_TF32, "mma-tf32", CLATTN_F32, {CLATTN__TILE_NV, 32}, takes_ptx_mma},
};
#define MECHANISMS (sizeof mechanisms / sizeof mechanisms[0])

/* The tile unit the emulation hook offers every device (tests), or 0. */
static int emulated_tile(void) {
    const int v = clattn__hook_value(CLATTN__HOOK_MATRIX_EMULATION);
    return v >= CLATTN__TILE_NV && v <= CLATTN__TILE_DPAS16 ? v : 0;
}

unsigned clattn__matrix_offered(cl_device_id device) {
    unsigned offered = 0;
    for (size_t i = 0; i < MECHANISMS; ++i)
        if (mechanisms[i].offered(device)) offered |= mechanisms[i].unit;
    return offered;
}

uint64_t clattn__tile_scratch_floats(const clattn__tile *tile, bool emulated) {
    if (!emulated) return 1;
    return tile->unit == CLATTN__TILE_NV ? 16 * 16 + 16 * 8 : 2 * 16 * 16;
}

bool clattn__matrix_units_emulated(void) {
    return emulated_tile() != 0;
}

/* A mechanism's probes: the native build where the device offers it, or with the emulation hook
 * the local-memory emulation of that hook's tile unit, offered to every device. NVIDIA's must
 * pass matrix_probe too. */
static int probe_mechanism(const clattn__call *call, const struct mechanism *m, bool *exact) {
    const int emulated = emulated_tile();
    *exact = false;
    if (emulated ? m->tile.unit != emulated : !m->offered(call->device)) return CLATTN_SUCCESS;
    char options[160];
    snprintf(options, sizeof options,
             "-cl-std=CL1.2 -DMMA_PROBE=1 -DMMA_NATIVE=%d -DMMA_UNIT=%d -DMMA_T=%s",
             emulated ? 0 : 1, m->tile.unit, clattn_dtype_name(m->type));
    if (m->type == CLATTN_F32) return clattn__tf32_probe(call, options, exact);
    int status = clattn__tile_probe(call, options, m->tile.subgroup, exact);
    if (status == CLATTN_SUCCESS && *exact && m->tile.unit == CLATTN__TILE_NV)
        status = clattn__matrix_probe(call, options, exact);
    return status;
}

typedef struct probe_entry {
    cl_context context;
    cl_device_id device;
    unsigned passed; /* bit i: mechanisms[i] passed its probes */
    struct probe_entry *next;
} probe_entry;
static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;
static probe_entry *probe_head;

static bool cached_units(cl_context context, cl_device_id device, unsigned *passed) {
    pthread_mutex_lock(&probe_lock);
    const probe_entry *e = probe_head;
    while (e && (e->context != context || e->device != device)) e = e->next;
    if (e) *passed = e->passed;
    pthread_mutex_unlock(&probe_lock);
    return e != NULL;
}

/* Two threads may probe the same device at once; both get the same answer, the first is kept. */
static void cache_units(cl_context context, cl_device_id device, unsigned passed) {
    probe_entry *e = malloc(sizeof *e);
    if (!e) return; /* the next call probes again */
    pthread_mutex_lock(&probe_lock);
    const probe_entry *known = probe_head;
    while (known && (known->context != context || known->device != device)) known = known->next;
    if (known) {
        free(e);
    } else {
        clRetainContext(context);
        *e = (probe_entry){context, device, passed, probe_head};
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

/* Which mechanisms passed on the call's device (bit i: mechanisms[i]), probed on first use. */
static int passed_mechanisms(const clattn__call *call, unsigned *passed) {
    *passed = 0;
    if (cached_units(call->context, call->device, passed)) return CLATTN_SUCCESS;
    unsigned found = 0;
    int status = CLATTN_SUCCESS;
    for (size_t i = 0; i < MECHANISMS && status == CLATTN_SUCCESS; ++i) {
        bool exact = false;
        status = probe_mechanism(call, &mechanisms[i], &exact);
        if (exact) found |= 1u << i;
    }
    if (status != CLATTN_SUCCESS) return status;
    cache_units(call->context, call->device, found);
    *passed = found;
    return CLATTN_SUCCESS;
}

int clattn__matrix_units(const clattn__call *call, unsigned *units) {
    unsigned passed = 0;
    const int status = passed_mechanisms(call, &passed);
    *units = 0;
    for (size_t i = 0; i < MECHANISMS; ++i)
        if (passed & (1u << i)) *units |= mechanisms[i].unit;
    return status;
}

int clattn__matrix_tile(const clattn__call *call, clattn_dtype type, clattn__tile *tile) {
    *tile = (clattn__tile){0, 0};
    /* f32 probes only a device offered the tf32 unit (or every device, emulated): other devices'
     * f32 calls should not build and run the 16-bit units' probes */
    bool offered = clattn__matrix_units_emulated();
    for (size_t i = 0; i < MECHANISMS && !offered && type == CLATTN_F32; ++i)
        offered = mechanisms[i].type == type && mechanisms[i].offered(call->device);
    if (type == CLATTN_F32 && !offered) return CLATTN_SUCCESS;
    unsigned passed = 0;
    const int status = passed_mechanisms(call, &passed);
    for (size_t i = 0; i < MECHANISMS && !tile->unit; ++i)
        if ((passed & (1u << i)) && mechanisms[i].type == type) *tile = mechanisms[i].tile;
    return status;
}

const char *clattn_matrix_unit_name(unsigned unit) {
    for (size_t i = 0; i < MECHANISMS; ++i)
        if (mechanisms[i].unit == unit) return mechanisms[i].name;
    return NULL;
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
