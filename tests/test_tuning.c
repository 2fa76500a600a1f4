/* Tests of the tuning table (src/tuning.c, src/tuning_table.def): lookup, fallback of a row that
 * does not fit the device, overrides through the API and CLATTN_TUNE, and their errors. */
#include "harness.h"
#include "internal.h"
#include "tuning.h"

#include <stdlib.h>
#include <string.h>

static const clattn__tuning_op *const ops[] = {&clattn__tuning_copy, &clattn__tuning_softmax,
                                               &clattn__tuning_attention,
                                               &clattn__tuning_linear_attention};

static cl_device_id device_of(test_ctx *t) {
    return clattn_env_device(t->env);
}

/* Every op has a default row and a GPU row, each giving every parameter within its range. */
static void every_row_is_complete(test_ctx *t) {
    static const char *const keys[] = {"default", "type:gpu"};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; ++o)
        for (int k = 0; k < 2; ++k) {
            long values[CLATTN__TUNING_MAX_PARAMS];
            CHECK_OK(t, clattn__tuning_row(ops[o], CLATTN_F32, keys[k], values));
        }
}

static void lookup_reflects_overrides(test_ctx *t) {
    char before[256], after[256];
    CHECK_OK(t, clattn_tuning_lookup(device_of(t), "softmax", CLATTN_F32, before, sizeof before));
    CHECK(t, strstr(before, "VARIANT=") && strstr(before, "SCRATCH="), "lookup gave %s", before);
    CHECK_OK(t, clattn_tuning_override("softmax", "GROUP=8,VEC=4"));
    int status = clattn_tuning_lookup(device_of(t), "softmax", CLATTN_F32, after, sizeof after);
    clattn_tuning_override("softmax", NULL);
    CHECK_OK(t, status);
    CHECK(t, strstr(after, "VEC=4,GROUP=8"), "with the override: %s", after);
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
    CHECK_STATUS(t, clattn_tuning_override("attention", "DECODE=3"), CLATTN_ERR_INVALID_TUNING);
    CHECK_STATUS(t, clattn_tuning_override("copy", "VEC=17"), CLATTN_ERR_INVALID_TUNING);
    CHECK_STATUS(t, clattn_tuning_override("gemm", "GROUP=8"), CLATTN_ERR_INVALID_ARGUMENT);
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
    char params[256];
    setenv("CLATTN_TUNE", "linear_attention:CHUNK=32;softmax:GROUP=4", 1);
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
    char params[256];
    CHECK_OK(t, clattn_tuning_override("attention", "PREFILL=1"));
    CHECK_OK(t, clattn_tuning_lookup(device_of(t), "attention", CLATTN_F32, params, sizeof params));
    CHECK_OK(t, clattn_tuning_override("attention", "LANES=4,GROUP=8"));
    status = clattn_tuning_lookup(device_of(t), "attention", CLATTN_F32, params, sizeof params);
    clattn_tuning_override("attention", NULL);
    CHECK(t, status == CLATTN_SUCCESS && strstr(params, "LANES=4,GROUP=8"), "%s: %s",
          clattn_status_name(status), params);
    char name[256] = "name:";
    clGetDeviceInfo(device_of(t), CL_DEVICE_NAME, sizeof name - 5, name + 5, NULL);
    const char *row[4] = {"softmax", "*", name, "VARIANT=0,VEC=16,GROUP=1024,SCRATCH=65536"};
    memcpy(clattn__tuning_test_row, row, sizeof row);
    char with_row[256], without[256];
    warnings = 0;
    clattn_set_log_callback(count_warning, NULL);
    status = clattn_tuning_lookup(device_of(t), "softmax", CLATTN_F32, with_row, sizeof with_row);
    clattn_set_log_callback(NULL, NULL);
    memset(clattn__tuning_test_row, 0, sizeof clattn__tuning_test_row);
    CHECK_OK(t, status);
    CHECK_OK(t, clattn_tuning_lookup(device_of(t), "softmax", CLATTN_F32, without, sizeof without));
    CHECK(t, strcmp(with_row, without) == 0, "the row that does not fit gave %s (else %s)",
          with_row, without);
    CHECK(t, warnings == 1, "%d warnings for the row that does not fit", warnings);
    CHECK_OK(t, small_softmax(t, NULL));
}

static const test_case cases[] = {
    {"every_row_is_complete", every_row_is_complete},
    {"lookup_reflects_overrides", lookup_reflects_overrides},
    {"malformed_overrides_are_errors", malformed_overrides_are_errors},
    {"environment_overrides", environment_overrides},
    {"rows_that_do_not_fit", rows_that_do_not_fit},
};
SUITE(tuning_suite, "tuning", cases);
