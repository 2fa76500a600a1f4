/* The matrix-unit probes (src/runtime/matrix_units.c, cl/mma.cl). On devices without a unit (PoCL,
 * Oclgrind) the probe runs the local-memory emulation of mma.sync, which proves the probe's own
 * check: the fragment layouts, the exact comparison, a wrong unit refused, a build failure taken
 * as no unit, and the cached per-device answer. */
#include "harness.h"
#include "runtime/runtime.h"
#include "runtime/testing.h"

#include <CL/cl_ext.h>
#include <string.h>

static const char *const emulated[2] = {"-cl-std=CL1.2 -DMMA_PROBE=1 -DMMA_PTX=0 -DMMA_T=f16",
                                        "-cl-std=CL1.2 -DMMA_PROBE=1 -DMMA_PTX=0 -DMMA_T=bf16"};

/* A call on the test's queue, as the library's entry points make one. */
static clattn__call probe_call(test_ctx *t) {
    clattn__call call = {0};
    if (clattn__begin_call(&call, clattn_env_queue(t->env), 0, NULL, NULL) != CLATTN_SUCCESS)
        test_fail_at(t, __FILE__, __LINE__, "clattn__begin_call: %s", clattn_last_error());
    return call;
}

/* A warp of 32 must fit one group, under CLATTN_MAX_WORK_GROUP too (the cbs lane caps groups at
 * 16: there every probe must fail). */
static bool warps_fit(test_ctx *t) {
    return clattn__device_max_group(clattn_env_device(t->env)) >= 32;
}

static void the_emulated_unit_passes_the_probe(test_ctx *t) {
    for (int i = 0; i < 2; ++i) {
        bool exact = !warps_fit(t);
        const clattn__call call = probe_call(t);
        CHECK_OK(t, clattn__matrix_probe(&call, emulated[i], &exact));
        CHECK(t, exact == warps_fit(t), "%s: exact %d with groups of 32 %s", emulated[i], exact,
              warps_fit(t) ? "allowed" : "refused");
    }
}

/* The probe is the test: a unit one element off, an exchange between lanes that does not
 * exchange, fragments loaded in the wrong layout, and a probe that does not build, count as no
 * unit, and none is an error of the call. */
static void a_wrong_or_missing_unit_fails_the_probe(test_ctx *t) {
    const clattn__call call = probe_call(t);
    bool exact = true;
    CHECK_OK(t, clattn__matrix_probe(
                    &call, "-cl-std=CL1.2 -DMMA_PROBE=1 -DMMA_PTX=0 -DMMA_PROBE_BREAK=1", &exact));
    CHECK(t, !exact, "a product off by one in one lane passed the probe");
    exact = true;
    CHECK_OK(t, clattn__matrix_probe(
                    &call, "-cl-std=CL1.2 -DMMA_PROBE=1 -DMMA_PTX=0 -DMMA_PROBE_BREAK=2", &exact));
    CHECK(t, !exact, "a lane exchange that returns the lane's own value passed the probe");
    exact = true;
    CHECK_OK(t, clattn__matrix_probe(
                    &call, "-cl-std=CL1.2 -DMMA_PROBE=1 -DMMA_PTX=0 -DMMA_PROBE_BREAK=3", &exact));
    CHECK(t, !exact, "B's fragments loaded untransposed passed the probe");
    exact = true;
    /* so that the probe builds: neither the program cache nor a disk cache has it */
    clattn_cache_clear(clattn_env_context(t->env));
    test_saved_env disk = test_env_set("CLATTN_CACHE_DIR", NULL);
    clattn__fault_arm(CLATTN__FAULT_BUILD, 1);
    int status = clattn__matrix_probe(&call, emulated[0], &exact);
    clattn__fault_arm(CLATTN__FAULT_BUILD, 0);
    test_env_restore(&disk);
    CHECK_OK(t, status);
    CHECK(t, !exact, "a probe that did not build passed");
}

/* A device offers the PTX units only with cl_nv_device_attribute_query; with the emulation hook
 * every device is offered both and must find both, probed once per context: a second call
 * creates no kernel (the cache's hits stay), and clattn_cache_clear forgets the answer. */
static void units_are_probed_once_per_device(test_ctx *t) {
    cl_command_queue queue = clattn_env_queue(t->env);
    cl_context context = clattn_env_context(t->env);
    char extensions[8192] = "";
    clGetDeviceInfo(clattn_env_device(t->env), CL_DEVICE_EXTENSIONS, sizeof extensions, extensions,
                    NULL);
    unsigned units = 99;
    CHECK_OK(t, clattn_matrix_units(queue, &units));
    CHECK(t, (units & ~(CLATTN_MATRIX_MMA_F16 | CLATTN_MATRIX_MMA_BF16)) == 0, "units %#x", units);
    if (!strstr(extensions, "cl_nv_device_attribute_query"))
        CHECK(t, units == 0, "units %#x on a device that offers none", units);

    clattn_cache_clear(context);
    clattn__hook_set(CLATTN__HOOK_MATRIX_EMULATION, 1);
    unsigned first = 0, again = 0, cleared = 0;
    size_t hits0 = 0, hits1 = 0;
    int status = clattn_matrix_units(queue, &first);
    clattn_cache_stats(NULL, NULL, &hits0);
    if (status == CLATTN_SUCCESS) status = clattn_matrix_units(queue, &again);
    clattn_cache_stats(NULL, NULL, &hits1);
    clattn__hook_set(CLATTN__HOOK_MATRIX_EMULATION, -1);
    CHECK_OK(t, status);
    const unsigned both = CLATTN_MATRIX_MMA_F16 | CLATTN_MATRIX_MMA_BF16;
    CHECK(t, first == (warps_fit(t) ? both : 0u), "emulated: %#x", first);
    CHECK(t, again == first && hits1 == hits0, "a second call probed again (%#x, hits %zu->%zu)",
          again, hits0, hits1);
    clattn_cache_clear(context);
    CHECK_OK(t, clattn_matrix_units(queue, &cleared));
    CHECK(t, cleared == units, "after clearing: %#x, before the emulation %#x", cleared, units);
    clattn_cache_clear(context);
}

/* A device that says it is a CUDA device of compute capability 8 or more is offered mma.sync
 * as inline PTX: there the probe must build and pass (else the build log says why), and the
 * device must report both units. Elsewhere (CI) this skips. */
static void a_device_offered_ptx_passes_its_probe(test_ctx *t) {
    cl_device_id device = clattn_env_device(t->env);
    char extensions[8192] = "";
    cl_uint major = 0;
    clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, sizeof extensions, extensions, NULL);
    if (!strstr(extensions, "cl_nv_device_attribute_query") ||
        clGetDeviceInfo(device, CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, sizeof major, &major,
                        NULL) != CL_SUCCESS ||
        major < 8) {
        test_skip(t, "the device offers no PTX matrix unit");
        return;
    }
    static const char *const ptx[2] = {"-cl-std=CL1.2 -DMMA_PROBE=1 -DMMA_PTX=1 -DMMA_T=f16",
                                       "-cl-std=CL1.2 -DMMA_PROBE=1 -DMMA_PTX=1 -DMMA_T=bf16"};
    for (int i = 0; i < 2; ++i) {
        cl_kernel kernel = NULL;
        CHECK_OK(t, clattn__create_kernel(clattn_env_context(t->env), device, "mma.cl", ptx[i],
                                          "matrix_probe", &kernel));
        if (kernel) clReleaseKernel(kernel);
        bool exact = false;
        const clattn__call call = probe_call(t);
        CHECK_OK(t, clattn__matrix_probe(&call, ptx[i], &exact));
        CHECK(t, exact, "%s: the instruction's product differs from the host's", ptx[i]);
    }
    unsigned units = 0;
    CHECK_OK(t, clattn_matrix_units(clattn_env_queue(t->env), &units));
    CHECK(t, units == (CLATTN_MATRIX_MMA_F16 | CLATTN_MATRIX_MMA_BF16), "units %#x", units);
}

static void bad_arguments_are_rejected(test_ctx *t) {
    unsigned units = 0;
    CHECK_STATUS(t, clattn_matrix_units(NULL, &units), CLATTN_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(t, clattn_matrix_units(clattn_env_queue(t->env), NULL),
                 CLATTN_ERR_INVALID_ARGUMENT);
}

static const test_case cases[] = {
    {"the_emulated_unit_passes_the_probe", the_emulated_unit_passes_the_probe},
    {"a_wrong_or_missing_unit_fails_the_probe", a_wrong_or_missing_unit_fails_the_probe},
    {"units_are_probed_once_per_device", units_are_probed_once_per_device},
    {"a_device_offered_ptx_passes_its_probe", a_device_offered_ptx_passes_its_probe},
    {"bad_arguments_are_rejected", bad_arguments_are_rejected, TAG_HOST},
};
SUITE(matrix_units_suite, "matrix_units", cases);
