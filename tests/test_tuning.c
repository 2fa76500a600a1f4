/* Tests of the tuning table (src/runtime/tuning.c, tuning_params.h, tuning_table.def): lookup,
 * fallback of a row that does not fit the device, overrides through the API and CLATTN_TUNE,
 * and their errors. */
#include "ops/blas.h"
#include "harness.h"
#include "runtime/runtime.h"
#include "runtime/testing.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const clattn__tuning_op *const ops[] = {&clattn__tuning_copy, &clattn__tuning_softmax,
                                               &clattn__tuning_attention,
                                               &clattn__tuning_linear_attention};

static cl_device_id device_of(test_ctx *t) {
    return clattn_env_device(t->env);
}

/* Every op has a default row (tuning_params.h's DEFAULT column) and a GPU row, each giving
 * every parameter within its range. */
static void every_row_is_complete(test_ctx *t) {
    static const char *const keys[] = {"default", "type:gpu"};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; ++o)
        for (int k = 0; k < 2; ++k) {
            long values[CLATTN__TUNING_MAX_PARAMS];
            CHECK_OK(t, clattn__tuning_row(ops[o], CLATTN_F32, keys[k], values));
        }
    CHECK_OK(t, clattn__tuning_check_table()); /* and every other row (name:, type:cpu, gemm) */
}

/* The typed view of a row (tuning_params.h) holds the row's values by name, and the build
 * options carry exactly the parameters that have a kernel macro, under that macro's name. */
static void typed_rows_and_build_options(test_ctx *t) {
    clattn__attention_tuning a;
    CHECK_OK(t, clattn__attention_tuning_row(CLATTN_F32, "type:gpu", &a));
    long values[CLATTN__TUNING_MAX_PARAMS];
    CHECK_OK(t, clattn__tuning_row(&clattn__tuning_attention, CLATTN_F32, "type:gpu", values));
    CHECK(t, a.PREFILL == values[0] && a.LANES == values[2] && a.BN == values[8],
          "typed PREFILL %ld LANES %ld BN %ld against %ld %ld %ld", a.PREFILL, a.LANES, a.BN,
          values[0], values[2], values[8]);
    a.LANES = 8, a.TK = 16, a.BM = 2, a.BN = 32, a.GROUP = 77, a.MQ = 8, a.MK = 1;
    a.UNITS = 0, a.UNIT_KEYS = 48, a.UNIT_QUERIES = 16, a.LANE_TILES = 3;
    char options[256] = "-cl-std=CL1.2";
    clattn__attention_tuning_options(&a, options, sizeof options);
    CHECK(t,
          strcmp(options, "-cl-std=CL1.2 -DVEC=8 -DTK=16 -DBM=2 -DBN=32 -DMQ=8 -DMK=1 -DMMA_KT=48 "
                          "-DMMA_WQ=16 -DLANE_TILES=3") == 0,
          "attention's build options: \"%s\"", options);
    clattn__copy_tuning c = {.VEC = 4, .RUN = 9, .GROUP = 3};
    options[0] = '\0';
    clattn__copy_tuning_options(&c, options, sizeof options);
    CHECK(t, strcmp(options, " -DVEC=4 -DTILES=0") == 0, "copy's build options: \"%s\"", options);
    /* a buffer too small is cut, never overrun */
    char small[8] = "ab";
    clattn__copy_tuning_options(&c, small, sizeof small);
    CHECK(t, strlen(small) < sizeof small, "cut options \"%s\"", small);
}

/* The overrides below fit every device: the group variant of softmax keeps no rows in local
 * memory (a 32 KiB device, the OpenCL minimum, cannot hold the CPU rows' scratch), and OpenCL
 * devices run groups of 8 or more (Mesa's llvmpipe ran these tests). */
static void lookup_reflects_overrides(test_ctx *t) {
    char before[256], after[256], error[256] = "";
    CHECK_OK(t, clattn_tuning_lookup(device_of(t), "softmax", CLATTN_F32, before, sizeof before));
    CHECK(t, strstr(before, "VARIANT=") && strstr(before, "SCRATCH="), "lookup gave %s", before);
    CHECK_OK(t, clattn_tuning_override("softmax", "VARIANT=1,GROUP=8,VEC=4"));
    int status = clattn_tuning_lookup(device_of(t), "softmax", CLATTN_F32, after, sizeof after);
    snprintf(error, sizeof error, "%s", clattn_last_error()); /* the next call clears it */
    clattn_tuning_override("softmax", NULL);
    CHECK(t, status == CLATTN_SUCCESS, "with the override: %s: %s", clattn_status_name(status),
          error);
    CHECK(t, strstr(after, "VARIANT=1,VEC=4,GROUP=8"), "with the override: %s", after);
    CHECK_OK(t, clattn_tuning_lookup(device_of(t), "softmax", CLATTN_F32, after, sizeof after));
    CHECK(t, strcmp(before, after) == 0, "cleared: %s, before: %s", after, before);
}

static void malformed_overrides_are_errors(test_ctx *t) {
    static const char *const bad[] = {"GROUP",           "GROUP=",   "GROUP=8x",       "WIDTH=4",
                                      "GROUP=0",         "VEC=99",   "GROUP=8,,VEC=4", "=8",
                                      "GROUP=8,",        "GROUP= 8", "GROUP=+8",       "GROUP=-8",
                                      "GROUP=8,GROUP=16"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i)
        CHECK_STATUS(t, clattn_tuning_override("softmax", bad[i]), CLATTN_ERR_INVALID_TUNING);
    CHECK_STATUS(t, clattn_tuning_override("attention", "DECODE=5"), CLATTN_ERR_INVALID_TUNING);
    /* in range, but not a tile a work-item can take: refused where the row is looked up */
    CHECK_OK(t, clattn_tuning_override("attention", "MK=3"));
    char row[512];
    int mk_status = clattn_tuning_lookup(device_of(t), "attention", CLATTN_F32, row, sizeof row);
    clattn_tuning_override("attention", NULL);
    CHECK(t, mk_status == CLATTN_ERR_INVALID_TUNING, "MK=3 looked up -> %s",
          clattn_status_name(mk_status));
    CHECK_STATUS(t, clattn_tuning_override("copy", "VEC=17"), CLATTN_ERR_INVALID_TUNING);
    CHECK_STATUS(t, clattn_tuning_override("gemm", "GROUP=8"), CLATTN_ERR_INVALID_TUNING);
    CHECK_STATUS(t, clattn_tuning_override("gemv", "GROUP=8"), CLATTN_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(t, clattn_tuning_override(NULL, "GROUP=8"), CLATTN_ERR_INVALID_ARGUMENT);
    char params[8];
    CHECK_STATUS(t, clattn_tuning_lookup(device_of(t), "softmax", CLATTN_F32, params, 8),
                 CLATTN_ERR_INVALID_ARGUMENT);
}

/* A softmax call on a small tensor; returns its status. */
static int small_softmax(test_ctx *t, cl_event *event) {
    cl_mem buffer = test_buffer(t, 4 * 64);
    if (!buffer) return CLATTN_ERR_OUT_OF_HOST_MEMORY;
    float zeros[64] = {0};
    test_write(t, buffer, zeros, sizeof zeros);
    clattn_tensor x = clattn_tensor_4d(buffer, CLATTN_F32, 1, 1, 4, 16);
    int status = clattn_softmax(&x, 1.0f, NULL, &x, NULL, clattn_env_queue(t->env), 0, NULL, event);
    clFinish(clattn_env_queue(t->env));
    clReleaseMemObject(buffer);
    return status;
}

static void environment_overrides(test_ctx *t) {
    char params[CLATTN_TUNING_PARAMS_MAX];
    setenv("CLATTN_TUNE", "linear_attention:CHUNK=32;softmax:VARIANT=1,GROUP=4", 1);
    int status = clattn_tuning_lookup(device_of(t), "softmax", CLATTN_F32, params, sizeof params);
    if (status == CLATTN_SUCCESS && !strstr(params, "GROUP=4,")) status = -1;
    setenv("CLATTN_TUNE", "softmax:GROUP", 1); /* malformed: every softmax call fails */
    cl_event event = (cl_event)1;
    int bad = small_softmax(t, &event);
    /* an unknown op, an empty section, a trailing ';' and an op given twice are errors too */
    static const char *const malformed[] = {"attention_v2:GROUP=4", "softmax:", "softmax:GROUP=4;",
                                            "softmax:GROUP=4;;copy:VEC=4",
                                            "softmax:GROUP=4;softmax:VEC=4"};
    int unknown = CLATTN_ERR_INVALID_TUNING;
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; ++i) {
        setenv("CLATTN_TUNE", malformed[i], 1);
        int got = clattn_tuning_lookup(device_of(t), "softmax", CLATTN_F32, params, sizeof params);
        if (got != CLATTN_ERR_INVALID_TUNING) unknown = got;
    }
    unsetenv("CLATTN_TUNE");
    /* the API's override wins over CLATTN_TUNE where both name a parameter */
    setenv("CLATTN_TUNE", "softmax:VARIANT=1,GROUP=4,VEC=8", 1);
    clattn_tuning_override("softmax", "GROUP=8");
    int both = clattn_tuning_lookup(device_of(t), "softmax", CLATTN_F32, params, sizeof params);
    char error[256];
    snprintf(error, sizeof error, "%s", clattn_last_error()); /* the next call clears it */
    clattn_tuning_override("softmax", NULL);
    unsetenv("CLATTN_TUNE");
    CHECK(t, both == CLATTN_SUCCESS && strstr(params, "VEC=8,GROUP=8,"),
          "CLATTN_TUNE's VEC=8 under the API's GROUP=8 gave %s (%s): %s", clattn_status_name(both),
          error, params);
    CHECK(t, status == CLATTN_SUCCESS, "CLATTN_TUNE's GROUP=4 did not reach softmax: %s", params);
    CHECK(t, bad == CLATTN_ERR_INVALID_TUNING, "a malformed CLATTN_TUNE gave %s",
          clattn_status_name(bad));
    CHECK(t, event == NULL, "*event is set after a failure");
    CHECK(t, unknown == CLATTN_ERR_INVALID_TUNING, "a malformed CLATTN_TUNE gave %s",
          clattn_status_name(unknown));
    CHECK_OK(t, small_softmax(t, NULL));
}

/* An override past the device's limits fails the call; a table row past them falls back to the
 * next level with a warning. */
static int warnings;
static void count_warning(int status, const char *message, void *user) {
    (void)message, (void)user;
    if (status == CLATTN_SUCCESS) ++warnings;
}

static void rows_that_do_not_fit(test_ctx *t) {
    CHECK_OK(t, clattn_tuning_override("softmax", "VARIANT=0,GROUP=1024,SCRATCH=65536"));
    int status = small_softmax(t, NULL);
    clattn_tuning_override("softmax", NULL);
    CHECK(t, status == CLATTN_ERR_INVALID_TUNING, "an override past local memory gave %s",
          clattn_status_name(status));
    /* the keys variant is a group per query row: it cannot run prefill */
    char params[CLATTN_TUNING_PARAMS_MAX];
    CHECK_OK(t, clattn_tuning_override("attention", "PREFILL=1"));
    CHECK_OK(t, clattn_tuning_lookup(device_of(t), "attention", CLATTN_F32, params, sizeof params));
    CHECK_OK(t, clattn_tuning_override("attention", "LANES=4,GROUP=8"));
    status = clattn_tuning_lookup(device_of(t), "attention", CLATTN_F32, params, sizeof params);
    clattn_tuning_override("attention", NULL);
    CHECK(t, status == CLATTN_SUCCESS && strstr(params, "LANES=4,GROUP=8"), "%s: %s",
          clattn_status_name(status), params);
    char name[256] = "name:";
    clGetDeviceInfo(device_of(t), CL_DEVICE_NAME, sizeof name - 5, name + 5, NULL);
    /* the lookup without that row may warn too (a device with little local memory skips the
     * CPU rows): the row adds one warning */
    char with_row[256], without[256];
    warnings = 0;
    clattn_set_log_callback(count_warning, NULL);
    clattn__tuning_set_test_row(NULL); /* forgets the kept answers: this lookup warns anew */
    int plain = clattn_tuning_lookup(device_of(t), "softmax", CLATTN_F32, without, sizeof without);
    const int before = warnings;
    const char *row[4] = {"softmax", "*", name, "VARIANT=0,VEC=16,GROUP=1024,SCRATCH=65536"};
    clattn__tuning_set_test_row(row);
    status = clattn_tuning_lookup(device_of(t), "softmax", CLATTN_F32, with_row, sizeof with_row);
    clattn_set_log_callback(NULL, NULL);
    clattn__tuning_set_test_row(NULL);
    CHECK_OK(t, plain);
    CHECK_OK(t, status);
    CHECK(t, strcmp(with_row, without) == 0, "the row that does not fit gave %s (else %s)",
          with_row, without);
    CHECK(t, warnings == 2 * before + 1, "%d warnings for the row that does not fit, %d without it",
          warnings - before, before);
    CHECK_OK(t, small_softmax(t, NULL));
}

/* The table's answers are kept per device, op, dtype and caps: a row is read (and its warning
 * given) once, a cap that changes the answer changes it at the next lookup (its warnings once
 * too), and lifting the cap brings the first answer back. A GROUP of 48 is the test row's alone
 * (no table row and no default has it); under a cap of 16 groups it does not fit, and the next
 * level's answer, whatever this device's is, has another. */
static void lookups_are_kept_per_device_and_cap(test_ctx *t) {
    char name[256] = "name:";
    clGetDeviceInfo(device_of(t), CL_DEVICE_NAME, sizeof name - 5, name + 5, NULL);
    const char *row[4] = {"copy", "*", name, "VEC=4,RUN=4,GROUP=48"};
    char first[256] = "", again[256] = "", capped[256] = "", capped_again[256] = "";
    char lifted[256] = "";
    if (clattn__device_max_group(device_of(t)) < 48)
        return test_skip(t, "the device's groups are below the test row's 48");
    clattn__tuning_set_test_row(row);
    warnings = 0;
    clattn_set_log_callback(count_warning, NULL);
    CHECK_OK(t, clattn_tuning_lookup(device_of(t), "copy", CLATTN_F32, first, sizeof first));
    CHECK_OK(t, clattn_tuning_lookup(device_of(t), "copy", CLATTN_F32, again, sizeof again));
    const int quiet = warnings;
    test_saved_env cap = test_env_set("CLATTN_MAX_WORK_GROUP", "16");
    CHECK_OK(t, clattn_tuning_lookup(device_of(t), "copy", CLATTN_F32, capped, sizeof capped));
    const int under_cap = warnings - quiet;
    CHECK_OK(t, clattn_tuning_lookup(device_of(t), "copy", CLATTN_F32, capped_again,
                                     sizeof capped_again));
    const int repeated = warnings - quiet - under_cap;
    test_env_restore(&cap);
    CHECK_OK(t, clattn_tuning_lookup(device_of(t), "copy", CLATTN_F32, lifted, sizeof lifted));
    clattn_set_log_callback(NULL, NULL);
    clattn__tuning_set_test_row(NULL);
    CHECK(t, strstr(first, "GROUP=48") && strcmp(first, again) == 0 && strcmp(first, lifted) == 0,
          "the test row's answer: %s, again %s, after the cap %s", first, again, lifted);
    CHECK(t, quiet == 0, "%d warnings for a row that fits", quiet);
    CHECK(t,
          !strstr(capped, "GROUP=48") && under_cap >= 1 && repeated == 0 &&
              strcmp(capped, capped_again) == 0,
          "under a cap of 16: %s, %d warnings, then %d more", capped, under_cap, repeated);
}

/* c = a b^T for a batch of 2 odd-sized matrices through the CLBlast bridge, against the host:
 * |c - ref| <= 2 K 2^-24 sum_k |a_ik b_jk| (the bound on a float32 sum of K products). */
static void check_small_gemm(test_ctx *t, const char *what) {
    enum { M = 70, N = 33, K = 40, BATCH = 2 };
    static float a[BATCH * M * K], b[BATCH * N * K], c[BATCH * M * N];
    for (int i = 0; i < BATCH * M * K; ++i) a[i] = (float)((i * 37) % 101 - 50) / 50.0f;
    for (int i = 0; i < BATCH * N * K; ++i) b[i] = (float)((i * 53) % 97 - 48) / 48.0f;
    cl_mem ab = test_buffer(t, sizeof a), bb = test_buffer(t, sizeof b),
           cb = test_buffer(t, sizeof c);
    bool ok = ab && bb && cb && test_write(t, ab, a, sizeof a) && test_write(t, bb, b, sizeof b);
    const clattn__call call = {
        clattn_env_queue(t->env), clattn_env_context(t->env), device_of(t), 0, NULL, NULL};
    const clattn__matrices am = {ab, 0, K, M * K}, bm = {bb, 0, K, N * K}, cm = {cb, 0, N, M * N};
    int status = ok ? clattn__sgemm_batched(&call, true, M, N, K, &am, &bm, 0.0f, &cm, BATCH) : -1;
    CHECK(t, status == CLATTN_SUCCESS, "%s: %s: %s", what, clattn_status_name(status),
          clattn_last_error());
    ok = ok && status == CLATTN_SUCCESS && test_read(t, cb, c, sizeof c);
    for (int i = 0; ok && i < BATCH * M * N; ++i) {
        const int batch = i / (M * N), row = i / N % M, col = i % N;
        double want = 0, scale = 0;
        for (int e = 0; e < K; ++e) {
            double p = (double)a[(batch * M + row) * K + e] * b[(batch * N + col) * K + e];
            want += p;
            scale += fabs(p);
        }
        ok = fabs(c[i] - want) <= 2.0 * K * ldexp(1.0, -24) * scale;
        CHECK(t, ok, "%s: c[%d] = %.9g, expected %.9g", what, i, c[i], want);
    }
    cl_mem all[3] = {ab, bb, cb};
    for (int i = 0; i < 3; ++i)
        if (all[i]) clReleaseMemObject(all[i]);
}

/* The gemm row reaches CLBlast: a partial override needs a row under it, a set past the Xgemm
 * kernel's constraints is refused, and complete sets reach CLBlast's GEMM (CLBlast refuses a
 * set with a name missing or wrong), whose results stay right. MIN_INDIRECT=1 makes CLBlast
 * take its tiled (indirect) kernel, the one the other parameters shape, for every size. */
static void gemm_rows_reach_clblast(test_ctx *t) {
    char params[CLATTN_TUNING_PARAMS_MAX];
    const bool has_row =
        clattn_tuning_lookup(device_of(t), "gemm", CLATTN_F32, params, sizeof params) == 0;
    CHECK_OK(t, clattn_tuning_override("gemm", "KWG=32")); /* fits the type:cpu row */
    int partial = clattn_tuning_lookup(device_of(t), "gemm", CLATTN_F32, params, sizeof params);
    CHECK(t, has_row ? partial == CLATTN_SUCCESS : partial == CLATTN_ERR_INVALID_TUNING,
          "a partial gemm override (the device has %s row) gave %s", has_row ? "a" : "no",
          clattn_status_name(partial));
    /* one set that fits and differs from CLBlast's defaults everywhere it can (each set costs
     * PoCL a half-minute build of CLBlast's GEMM program), one that breaks a constraint */
    static const char *const sets[] = {
        "MWG=32,NWG=64,KWG=32,MDIMC=8,NDIMC=16,MDIMA=8,NDIMB=16,KWI=2,VWM=4,VWN=4,STRM=1,STRN=1,"
        "SA=1,SB=1,MIN_INDIRECT=1",
        /* MWG = 64 is no multiple of MDIMC * VWM = 128 */
        "MWG=64,NWG=64,KWG=16,MDIMC=16,NDIMC=8,MDIMA=8,NDIMB=8,KWI=1,VWM=8,VWN=8,STRM=0,STRN=0,"
        "SA=0,SB=0,MIN_INDIRECT=1"};
    CHECK_OK(t, clattn_tuning_override("gemm", sets[0]));
    /* Oclgrind's uninitialized-value checker misreads CLBlast's GEMM (harness.h) */
    if (!test_under_uninit_checker()) check_small_gemm(t, sets[0]);
    CHECK_OK(t, clattn_tuning_override("gemm", sets[1]));
    int unfit = clattn_tuning_lookup(device_of(t), "gemm", CLATTN_F32, params, sizeof params);
    char why[512];
    snprintf(why, sizeof why, "%s", clattn_last_error());
    clattn_tuning_override("gemm", NULL);
    CHECK(t, unfit == CLATTN_ERR_INVALID_TUNING && strstr(why, "MDIMC*VWM"),
          "a gemm set past the kernel's constraints gave %s: %s", clattn_status_name(unfit), why);
}

/* The longest answer clattn_tuning_lookup can give for `op`: every parameter at the widest
 * value its range allows, "NAME=VALUE," each, and the NUL. */
static size_t widest_lookup(const clattn__tuning_op *op) {
    size_t bytes = 1;
    for (int i = 0; i < op->count; ++i) {
        const int low = snprintf(NULL, 0, "%ld", op->min[i]);
        const int high = snprintf(NULL, 0, "%ld", op->max[i]);
        bytes += strlen(op->params[i]) + 2 + (size_t)(low > high ? low : high);
    }
    return bytes;
}

/* CLATTN_TUNING_PARAMS_MAX bytes hold any op's lookup, whatever its values; the device's own
 * answer fits it too, and is an override the op takes back. */
static void every_lookup_fits_the_documented_buffer(test_ctx *t) {
#define OP_ADDRESS(op, PARAMS, has_default) &clattn__tuning_##op,
    static const clattn__tuning_op *const all_ops[] = {CLATTN__TUNING_OPS(OP_ADDRESS)};
#undef OP_ADDRESS
    for (size_t i = 0; i < sizeof all_ops / sizeof all_ops[0]; ++i) {
        const clattn__tuning_op *op = all_ops[i];
        const size_t widest = widest_lookup(op);
        CHECK(t, widest <= CLATTN_TUNING_PARAMS_MAX, "%s's lookup may take %zu bytes, past %d",
              op->name, widest, CLATTN_TUNING_PARAMS_MAX);
        if (!op->has_default) continue; /* (gemm: no row on a device without one) */
        char params[CLATTN_TUNING_PARAMS_MAX];
        CHECK_OK(t,
                 clattn_tuning_lookup(device_of(t), op->name, CLATTN_F32, params, sizeof params));
        CHECK_OK(t, clattn_tuning_override(op->name, params)); /* an answer is an override */
        clattn_tuning_override(op->name, NULL);
    }
}

static const test_case cases[] = {
    {"every_row_is_complete", every_row_is_complete},
    {"every_lookup_fits_the_documented_buffer", every_lookup_fits_the_documented_buffer},
    {"typed_rows_and_build_options", typed_rows_and_build_options, TAG_HOST},
    {"lookup_reflects_overrides", lookup_reflects_overrides, TAG_HOST},
    {"malformed_overrides_are_errors", malformed_overrides_are_errors},
    {"environment_overrides", environment_overrides},
    {"rows_that_do_not_fit", rows_that_do_not_fit},
    {"lookups_are_kept_per_device_and_cap", lookups_are_kept_per_device_and_cap, TAG_HOST},
    {"gemm_rows_reach_clblast", gemm_rows_reach_clblast},
};
SUITE_TAGGED(tuning_suite, "tuning", cases, TAG_SMOKE);
