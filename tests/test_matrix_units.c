/* The matrix-unit probes (src/runtime/matrix_units.c, cl/mma.cl). On devices without a unit (PoCL,
 * Oclgrind) the probes run the local-memory emulations of each mechanism, which prove the probes'
 * own checks: the fragment layouts, the exact comparison, a wrong unit refused, a build failure
 * taken as no unit, and the cached per-device answer. */
#include "harness.h"
#include "runtime/runtime.h"
#include "runtime/testing.h"

#include <CL/cl_ext.h>
#include <stdio.h>
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

/* A warp of 32 must fit one group, under CLATTN_MAX_WORK_GROUP too (the small-groups lane caps
 * groups at 16: there every probe must fail). */
static bool warps_fit(test_ctx *t) {
    return clattn__device_max_group(clattn_env_device(t->env)) >= 32;
}

static const char *const emulated_tf32 = "-cl-std=CL1.2 -DMMA_PROBE=1 -DMMA_PTX=0 -DMMA_T=f32";

static void the_emulated_unit_passes_the_probe(test_ctx *t) {
    for (int i = 0; i < 3; ++i) {
        bool exact = !warps_fit(t);
        const clattn__call call = probe_call(t);
        const char *options = i < 2 ? emulated[i] : emulated_tf32;
        CHECK_OK(t, i < 2 ? clattn__matrix_probe(&call, options, &exact)
                          : clattn__tf32_probe(&call, options, &exact));
        CHECK(t, exact == warps_fit(t), "%s: exact %d with groups of 32 %s", options, exact,
              warps_fit(t) ? "allowed" : "refused");
    }
}

/* The probe is the test: a unit one element off, an exchange between lanes that does not
 * exchange, fragments loaded in the wrong layout, and a probe that does not build, count as no
 * unit, and none is an error of the call. */
static void a_wrong_or_missing_unit_fails_the_probe(test_ctx *t) {
    static const struct {
        bool tf32;
        const char *options, *what;
    } broken[] = {
        {false, "-DMMA_PROBE_BREAK=1", "a product off by one in one lane"},
        {false, "-DMMA_PROBE_BREAK=2", "a lane exchange that returns the lane's own value"},
        {false, "-DMMA_PROBE_BREAK=3", "B's fragments loaded untransposed"},
        {true, "-DMMA_T=f32 -DMMA_PROBE_BREAK=1", "a tf32 product off by one in one lane"},
        {true, "-DMMA_T=f32 -DMMA_PROBE_BREAK=2",
         "a tf32 lane exchange that returns the lane's own value"},
        {true, "-DMMA_T=f32 -DMMA_PROBE_BREAK=3", "3xTF32 products without their small parts"},
    };
    const clattn__call call = probe_call(t);
    bool exact = true;
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; ++i) {
        char options[160];
        snprintf(options, sizeof options, "-cl-std=CL1.2 -DMMA_PROBE=1 -DMMA_PTX=0 %s",
                 broken[i].options);
        exact = true;
        CHECK_OK(t, broken[i].tf32 ? clattn__tf32_probe(&call, options, &exact)
                                   : clattn__matrix_probe(&call, options, &exact));
        CHECK(t, !exact, "%s passed the probe", broken[i].what);
    }
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

/* Every mechanism's subgroup tile, emulated (the hook offers one to every device): its probe
 * passes in both dtypes where a group holds its subgroup, the units come back as its bits
 * (NVIDIA's: f16, bf16 and the tf32 warp products), and kernels get its tile; one lane off by one,
 * or B's k-major fragments loaded n-major, fail it. */
static void every_tile_unit_passes_its_probe(test_ctx *t) {
    static const struct {
        int unit, subgroup;
        unsigned bits;
    } units[] = {
        {CLATTN__TILE_NV, 32,
         CLATTN_MATRIX_MMA_F16 | CLATTN_MATRIX_MMA_BF16 | CLATTN_MATRIX_MMA_TF32},
        {CLATTN__TILE_WMMA, 32, CLATTN_MATRIX_WMMA_F16 | CLATTN_MATRIX_WMMA_BF16},
        {CLATTN__TILE_MFMA, 64, CLATTN_MATRIX_MFMA_F16 | CLATTN_MATRIX_MFMA_BF16},
        {CLATTN__TILE_DPAS8, 8, CLATTN_MATRIX_DPAS_F16 | CLATTN_MATRIX_DPAS_BF16},
        {CLATTN__TILE_DPAS16, 16, CLATTN_MATRIX_DPAS_F16 | CLATTN_MATRIX_DPAS_BF16},
    };
    cl_context context = clattn_env_context(t->env);
    const size_t max_group = clattn__device_max_group(clattn_env_device(t->env));
    for (size_t u = 0; u < sizeof units / sizeof units[0] && !t->failed; ++u) {
        const bool fits = max_group >= (size_t)units[u].subgroup;
        const clattn__call call = probe_call(t);
        clattn_cache_clear(context);
        clattn__hook_set(CLATTN__HOOK_MATRIX_EMULATION, units[u].unit);
        unsigned found = 0;
        clattn__tile tile = {-1, -1};
        int status = clattn__matrix_units(&call, &found);
        if (status == CLATTN_SUCCESS) status = clattn__matrix_tile(&call, CLATTN_BF16, &tile);
        clattn__hook_set(CLATTN__HOOK_MATRIX_EMULATION, -1);
        CHECK_OK(t, status);
        CHECK(t, found == (fits ? units[u].bits : 0u), "tile unit %d: units %#x", units[u].unit,
              found);
        CHECK(t,
              fits ? tile.unit == units[u].unit && tile.subgroup == units[u].subgroup
                   : tile.unit == 0,
              "tile unit %d: kernels get unit %d of %d", units[u].unit, tile.unit, tile.subgroup);
        for (int broken = 1; broken <= 3 && fits && !t->failed; broken += 2) {
            char options[160];
            snprintf(options, sizeof options,
                     "-cl-std=CL1.2 -DMMA_PROBE=1 -DMMA_UNIT=%d -DMMA_PROBE_BREAK=%d",
                     units[u].unit, broken);
            bool exact = true;
            CHECK_OK(t, clattn__tile_probe(&call, options, units[u].subgroup, &exact));
            CHECK(t, !exact, "%s passed the probe", options);
        }
    }
    clattn_cache_clear(context);
}

/* A device offers units only with the extensions matrix_units.c asks for; with the emulation hook
 * (NVIDIA's) every device is offered both of mma.sync's and must find both, probed once per
 * context: a second call creates no kernel (the cache's hits stay), and clattn_cache_clear forgets
 * the answer. */
static void units_are_probed_once_per_device(test_ctx *t) {
    cl_command_queue queue = clattn_env_queue(t->env);
    cl_context context = clattn_env_context(t->env);
    unsigned units = 999;
    CHECK_OK(t, clattn_matrix_units(queue, &units));
    CHECK(t, units < 512u, "units %#x: a bit clattn.h does not define", units);
    const unsigned offered = clattn__matrix_offered(clattn_env_device(t->env));
    CHECK(t, (units & ~offered) == 0, "units %#x on a device offered %#x", units, offered);

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
    const unsigned all = CLATTN_MATRIX_MMA_F16 | CLATTN_MATRIX_MMA_BF16 | CLATTN_MATRIX_MMA_TF32;
    CHECK(t, first == (warps_fit(t) ? all : 0u), "emulated: %#x", first);
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
        clattn__release_kernel(kernel);
        bool exact = false;
        const clattn__call call = probe_call(t);
        CHECK_OK(t, clattn__matrix_probe(&call, ptx[i], &exact));
        CHECK(t, exact, "%s: the instruction's product differs from the host's", ptx[i]);
    }
    bool exact = false;
    const clattn__call call = probe_call(t);
    CHECK_OK(t, clattn__tf32_probe(&call, "-cl-std=CL1.2 -DMMA_PROBE=1 -DMMA_PTX=1 -DMMA_T=f32",
                                   &exact));
    CHECK(t, exact, "3xTF32: the instruction's products differ from the host's");
    unsigned units = 0;
    CHECK_OK(t, clattn_matrix_units(clattn_env_queue(t->env), &units));
    CHECK(t, units == (CLATTN_MATRIX_MMA_F16 | CLATTN_MATRIX_MMA_BF16 | CLATTN_MATRIX_MMA_TF32),
          "units %#x", units);
}

/* Every unit a device is offered must pass its probe there: on a GPU with one (NVIDIA's
 * mma.sync, AMD's WMMA or MFMA, Intel's dpas) a layout, a build or a launch that goes wrong
 * fails here rather than leaving the device without its unit silently. Elsewhere (CI) this
 * skips. */
static void a_device_offered_units_finds_them(test_ctx *t) {
    const unsigned offered = clattn__matrix_offered(clattn_env_device(t->env));
    if (!offered) return test_skip(t, "the device is offered no matrix unit");
    unsigned units = 0;
    CHECK_OK(t, clattn_matrix_units(clattn_env_queue(t->env), &units));
    CHECK(t, units == offered, "offered units %#x, found %#x (the build log says why)", offered,
          units);
}

/* Each CLATTN_MATRIX_* bit has its own name (the words the benchmark and the Python package
 * print); anything but one such bit has none. */
static void every_unit_bit_has_its_name(test_ctx *t) {
    static const struct {
        unsigned bit;
        const char *name;
    } names[] = {{CLATTN_MATRIX_MMA_F16, "mma-f16"},   {CLATTN_MATRIX_MMA_BF16, "mma-bf16"},
                 {CLATTN_MATRIX_WMMA_F16, "wmma-f16"}, {CLATTN_MATRIX_WMMA_BF16, "wmma-bf16"},
                 {CLATTN_MATRIX_MFMA_F16, "mfma-f16"}, {CLATTN_MATRIX_MFMA_BF16, "mfma-bf16"},
                 {CLATTN_MATRIX_DPAS_F16, "dpas-f16"}, {CLATTN_MATRIX_DPAS_BF16, "dpas-bf16"},
                 {CLATTN_MATRIX_MMA_TF32, "mma-tf32"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
        const char *name = clattn_matrix_unit_name(names[i].bit);
        CHECK(t, name && strcmp(name, names[i].name) == 0, "bit %#x: %s, expected %s", names[i].bit,
              name ? name : "NULL", names[i].name);
    }
    const unsigned none[] = {0, CLATTN_MATRIX_MMA_F16 | CLATTN_MATRIX_MMA_BF16, 512, 1u << 31};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; ++i)
        CHECK(t, clattn_matrix_unit_name(none[i]) == NULL, "%#x has a name", none[i]);
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
    {"every_tile_unit_passes_its_probe", every_tile_unit_passes_its_probe},
    {"units_are_probed_once_per_device", units_are_probed_once_per_device},
    {"a_device_offered_ptx_passes_its_probe", a_device_offered_ptx_passes_its_probe},
    {"a_device_offered_units_finds_them", a_device_offered_units_finds_them},
    {"every_unit_bit_has_its_name", every_unit_bit_has_its_name, TAG_HOST},
    {"bad_arguments_are_rejected", bad_arguments_are_rejected, TAG_HOST},
};
SUITE(matrix_units_suite, "matrix_units", cases);
