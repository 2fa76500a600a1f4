/* Device listing, selection (CLATTN_DEVICE specs) and the clattn_env convenience. */
#include "harness.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void the_test_device_is_listed(test_ctx *t) {
    size_t count = 0;
    CHECK_OK(t, clattn_list_devices(NULL, 0, &count));
    CHECK(t, count >= 1, "no devices listed");
    clattn_device_desc list[16];
    size_t n = 0;
    CHECK_OK(t, clattn_list_devices(list, 16, &n));
    CHECK(t, n == count, "count changed: %zu vs %zu", n, count);
    bool found = false;
    for (size_t i = 0; i < n && i < 16; ++i)
        found |= list[i].device == clattn_env_device(t->env) && list[i].name[0] != '\0';
    CHECK(t, found, "the env's device is not in the list");
    CHECK_STATUS(t, clattn_list_devices(NULL, 0, NULL), CLATTN_ERR_INVALID_ARGUMENT);
}

static bool contains_nocase(const char *haystack, const char *needle) {
    for (; *haystack; ++haystack) {
        size_t i = 0;
        while (needle[i] &&
               tolower((unsigned char)haystack[i]) == tolower((unsigned char)needle[i]))
            ++i;
        if (!needle[i]) return true;
    }
    return false;
}

static void specs_select_by_index_and_by_name(test_ctx *t) {
    const clattn_device_desc *mine = clattn_env_device_desc(t->env);
    clattn_device_desc got;
    char spec[64];
    snprintf(spec, sizeof spec, "%d:%d", mine->platform_index, mine->device_index);
    CHECK_OK(t, clattn_select_device(spec, &got));
    CHECK(t, got.device == mine->device, "%s picked %s", spec, got.name);
    /* a case-changed substring of the device name */
    size_t len = strlen(mine->name) < 6 ? strlen(mine->name) : 6;
    for (size_t i = 0; i < len; ++i) spec[i] = (char)toupper((unsigned char)mine->name[i]);
    spec[len] = '\0';
    CHECK_OK(t, clattn_select_device(spec, &got));
    CHECK(t, contains_nocase(got.name, spec) || contains_nocase(got.platform_name, spec),
          "%s picked %s", spec, got.name);
    CHECK_STATUS(t, clattn_select_device("no-such-device-anywhere", &got),
                 CLATTN_ERR_DEVICE_NOT_FOUND);
    CHECK_STATUS(t, clattn_select_device("99:0", &got), CLATTN_ERR_DEVICE_NOT_FOUND);
    CHECK_STATUS(t, clattn_select_device("0:x", &got), CLATTN_ERR_INVALID_DEVICE_SPEC);
    CHECK_STATUS(t, clattn_select_device("1:", &got), CLATTN_ERR_INVALID_DEVICE_SPEC);
    CHECK_STATUS(t, clattn_select_device("0:0:0", &got), CLATTN_ERR_INVALID_DEVICE_SPEC);
    CHECK_STATUS(t, clattn_select_device("pocl", NULL), CLATTN_ERR_INVALID_ARGUMENT);
}

static void the_environment_variable_is_the_default_spec(test_ctx *t) {
    const char *saved = getenv("CLATTN_DEVICE");
    char *copy = saved ? strdup(saved) : NULL;
    setenv("CLATTN_DEVICE", "no-such-device-anywhere", 1);
    clattn_device_desc got;
    int status = clattn_select_device(NULL, &got);
    clattn_env *env = NULL;
    int env_status = clattn_env_create("", &env);
    if (copy)
        setenv("CLATTN_DEVICE", copy, 1);
    else
        unsetenv("CLATTN_DEVICE");
    free(copy);
    CHECK(t, status == CLATTN_ERR_DEVICE_NOT_FOUND, "select -> %s", clattn_status_name(status));
    CHECK(t, env_status == CLATTN_ERR_DEVICE_NOT_FOUND && env == NULL, "env -> %s",
          clattn_status_name(env_status));
    CHECK(t, strstr(clattn_last_error(), "no-such-device-anywhere") != NULL, "message: %s",
          clattn_last_error());
}

static void env_tensors_round_trip(test_ctx *t) {
    const int64_t shape[4] = {2, 3, 5, 7};
    clattn_tensor x;
    CHECK_OK(t, clattn_env_alloc(t->env, CLATTN_F16, shape, &x));
    uint16_t in[210], out[210];
    for (int i = 0; i < 210; ++i) in[i] = (uint16_t)(i * 977u);
    int up = clattn_env_upload(t->env, &x, in);
    int down = clattn_env_download(t->env, &x, out);
    clattn_tensor strided = x;
    strided.strides[2] = 8;
    strided.shape[2] = 4;
    int bad = clattn_env_upload(t->env, &strided, in);
    clattn_tensor_free(&x);
    CHECK(t, x.buffer == NULL, "free clears the descriptor");
    CHECK(t, up == CLATTN_SUCCESS && down == CLATTN_SUCCESS, "upload %d download %d", up, down);
    CHECK(t, memcmp(in, out, sizeof in) == 0, "round trip changed the data");
    CHECK(t, bad == CLATTN_ERR_INVALID_ARGUMENT, "strided upload -> %s", clattn_status_name(bad));
    const int64_t zero[4] = {1, 0, 1, 1};
    CHECK_STATUS(t, clattn_env_alloc(t->env, CLATTN_F32, zero, &x), CLATTN_ERR_INVALID_SHAPE);
    CHECK_STATUS(t, clattn_env_alloc(t->env, (clattn_dtype)7, shape, &x),
                 CLATTN_ERR_UNSUPPORTED_DTYPE);
}

/* The element count must not wrap 64 bits on its way to the limit: 3 x 6148914691236517206 is
 * 2^64 + 2, which wrapped to 2, and the call allocated 8 bytes for that shape and succeeded. */
static void env_alloc_refuses_counts_that_wrap(test_ctx *t) {
    const int64_t wraps[4] = {3, 6148914691236517206, 1, 1};
    const int64_t huge[4] = {1, (int64_t)1 << 62, (int64_t)1 << 62, 1};
    clattn_tensor x;
    CHECK_STATUS(t, clattn_env_alloc(t->env, CLATTN_F32, wraps, &x), CLATTN_ERR_DEVICE_LIMIT);
    CHECK(t, x.buffer == NULL, "a failed allocation left a buffer");
    CHECK_STATUS(t, clattn_env_alloc(t->env, CLATTN_U8, huge, &x), CLATTN_ERR_DEVICE_LIMIT);
    CHECK(t, x.buffer == NULL, "a failed allocation left a buffer");
}

/* An environment over the caller's queue: same queue, context and device (described as the list
 * describes it), allocations and transfers through it, and its release leaves the caller's queue
 * working and the tensors it allocated alive. No kernel runs: memcheck's lane runs this test. */
static void env_wrap_shares_the_callers_queue(test_ctx *t) {
    cl_command_queue queue = clattn_env_queue(t->env);
    clattn_env *wrapped = NULL;
    CHECK_OK(t, clattn_env_wrap(queue, &wrapped));
    if (!wrapped) return;
    const clattn_device_desc *mine = clattn_env_device_desc(t->env);
    const clattn_device_desc *theirs = clattn_env_device_desc(wrapped);
    CHECK(t,
          clattn_env_queue(wrapped) == queue &&
              clattn_env_context(wrapped) == clattn_env_context(t->env) &&
              theirs->device == mine->device,
          "the wrapped env has another queue, context or device");
    CHECK(t,
          theirs->platform_index == mine->platform_index &&
              theirs->device_index == mine->device_index && strcmp(theirs->name, mine->name) == 0,
          "described as %d:%d %s, listed as %d:%d %s", theirs->platform_index, theirs->device_index,
          theirs->name, mine->platform_index, mine->device_index, mine->name);
    const int64_t shape[4] = {1, 1, 3, 5};
    float in[15], out[15] = {0};
    for (int i = 0; i < 15; ++i) in[i] = (float)i - 7.5f;
    clattn_tensor x = {0};
    CHECK_OK(t, clattn_env_alloc(wrapped, CLATTN_F32, shape, &x));
    CHECK_OK(t, clattn_env_upload(wrapped, &x, in));
    clattn_env_release(wrapped);
    CHECK_OK(t, clattn_env_download(t->env, &x, out));
    CHECK(t, memcmp(in, out, sizeof in) == 0, "the upload through the wrapped env differs");
    clattn_tensor_free(&x);
    clattn_env *none = (clattn_env *)1;
    CHECK_STATUS(t, clattn_env_wrap(NULL, &none), CL_INVALID_COMMAND_QUEUE);
    CHECK(t, none == NULL, "a failed wrap left *out set");
    CHECK_STATUS(t, clattn_env_wrap(queue, NULL), CLATTN_ERR_INVALID_ARGUMENT);
}

/* An op called on a wrapped env's queue, then the env released: the context's cached programs
 * stay (the caller still owns the context), and the op's result reads back through the
 * caller's env. */
static void a_wrapped_env_release_keeps_the_cached_programs(test_ctx *t) {
    clattn_env *wrapped = NULL;
    CHECK_OK(t, clattn_env_wrap(clattn_env_queue(t->env), &wrapped));
    if (!wrapped) return;
    const int64_t shape[4] = {1, 1, 3, 5};
    float in[15], out[15] = {0};
    for (int i = 0; i < 15; ++i) in[i] = (float)i - 7.5f;
    clattn_tensor x = {0}, y = {0};
    CHECK_OK(t, clattn_env_alloc(wrapped, CLATTN_F32, shape, &x));
    CHECK_OK(t, clattn_env_alloc(wrapped, CLATTN_F32, shape, &y));
    CHECK_OK(t, clattn_env_upload(wrapped, &x, in));
    CHECK_OK(t, clattn_copy(&x, NULL, &y, clattn_env_queue(wrapped), 0, NULL, NULL));
    size_t before = 0, after = 0;
    clattn_cache_stats(&before, NULL, NULL);
    clattn_env_release(wrapped);
    clattn_cache_stats(&after, NULL, NULL);
    CHECK(t, after == before && before > 0, "%zu cached programs before the release, %zu after",
          before, after);
    CHECK_OK(t, clattn_env_download(t->env, &y, out));
    CHECK(t, memcmp(in, out, sizeof in) == 0, "the copy through the wrapped queue differs");
    clattn_tensor_free(&x);
    clattn_tensor_free(&y);
}

/* The facts line: every field in its order, the values the driver gives (local memory under
 * CLATTN_MAX_LOCAL_MEMORY, as the plans see it), cut safely, and bad arguments refused. */
static void facts_describe_the_device(test_ctx *t) {
    cl_device_id device = clattn_env_device(t->env);
    char facts[8192], version[128] = "";
    CHECK_OK(t, clattn_device_facts(device, facts, sizeof facts));
    static const char *const fields[] = {
        "opencl=",        "opencl_c=",     "local_memory=", "max_work_group=",
        "compute_units=", "cache=",        "fp16=",         "fp64=",
        "subgroups=",     "vector_float=", "vector_half=",  "extensions="};
    const char *at = facts;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; ++i) {
        const char *next = strstr(at, fields[i]);
        CHECK(t, next && (next == facts || next[-1] == ' '), "no %s after \"%s\" in \"%s\"",
              fields[i], at, facts);
        at = next;
    }
    clGetDeviceInfo(device, CL_DEVICE_VERSION, sizeof version, version, NULL);
    char opencl[32];
    snprintf(opencl, sizeof opencl, "opencl=%.3s ", version + strlen("OpenCL "));
    CHECK(t, strncmp(facts, opencl, strlen(opencl)) == 0, "\"%s\" for %s", facts, version);
    test_saved_env cap = test_env_set("CLATTN_MAX_LOCAL_MEMORY", "4096");
    char capped[8192];
    int status = clattn_device_facts(device, capped, sizeof capped);
    test_env_restore(&cap);
    CHECK_OK(t, status);
    CHECK(t, strstr(capped, " local_memory=4096 "), "under a cap of 4096: %s", capped);
    char small[12];
    CHECK_OK(t, clattn_device_facts(device, small, sizeof small));
    CHECK(t, strlen(small) == sizeof small - 1 && strncmp(small, facts, sizeof small - 1) == 0,
          "cut to 12 bytes: \"%s\"", small);
    CHECK_STATUS(t, clattn_device_facts(NULL, facts, sizeof facts), CLATTN_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(t, clattn_device_facts(device, NULL, 8), CLATTN_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(t, clattn_device_facts(device, facts, 0), CLATTN_ERR_INVALID_ARGUMENT);
}

/* Every test but the last runs no kernel (tagged host: memcheck's lane runs them). */
static const test_case cases[] = {
    {"facts_describe_the_device", facts_describe_the_device, TAG_HOST},
    {"the_test_device_is_listed", the_test_device_is_listed, TAG_HOST},
    {"specs_select_by_index_and_by_name", specs_select_by_index_and_by_name, TAG_HOST},
    {"the_environment_variable_is_the_default_spec", the_environment_variable_is_the_default_spec,
     TAG_HOST},
    {"env_tensors_round_trip", env_tensors_round_trip, TAG_HOST},
    {"env_alloc_refuses_counts_that_wrap", env_alloc_refuses_counts_that_wrap, TAG_HOST},
    {"env_wrap_shares_the_callers_queue", env_wrap_shares_the_callers_queue, TAG_HOST},
    {"a_wrapped_env_release_keeps_the_cached_programs",
     a_wrapped_env_release_keeps_the_cached_programs},
};
SUITE_TAGGED(device_suite, "device", cases, TAG_SMOKE);
