/* The status table: every code has a unique name and a message; OpenCL codes pass through. */
#include "harness.h"
#include "runtime/runtime.h"
#include "runtime/testing.h"

#include <string.h>

static const int all_statuses[] = {
#define LIST_STATUS(name, value, message) value,
    CLATTN_STATUS_TABLE(LIST_STATUS)
#undef LIST_STATUS
};
#define STATUS_COUNT (sizeof all_statuses / sizeof all_statuses[0])

static void names_and_messages_are_unique(test_ctx *t) {
    for (size_t i = 0; i < STATUS_COUNT; ++i) {
        const char *name = clattn_status_name(all_statuses[i]);
        CHECK(t, strncmp(name, "CLATTN_", 7) == 0, "status %d has name %s", all_statuses[i], name);
        CHECK(t, clattn_status_string(all_statuses[i])[0] != '\0', "%s has no message", name);
        for (size_t j = 0; j < i; ++j) {
            CHECK(t, all_statuses[i] != all_statuses[j], "duplicate value %d", all_statuses[i]);
            CHECK(t, strcmp(name, clattn_status_name(all_statuses[j])) != 0, "duplicate %s", name);
        }
    }
}

static void library_codes_stay_out_of_opencl_and_clblast_ranges(test_ctx *t) {
    for (size_t i = 1; i < STATUS_COUNT; ++i)
        CHECK(t, all_statuses[i] <= -3000 && all_statuses[i] > -3100, "%s = %d",
              clattn_status_name(all_statuses[i]), all_statuses[i]);
}

static void opencl_codes_pass_through_with_their_names(test_ctx *t) {
    CHECK(t, strcmp(clattn_status_name(CL_OUT_OF_RESOURCES), "CL_OUT_OF_RESOURCES") == 0, "%s",
          clattn_status_name(CL_OUT_OF_RESOURCES));
    CHECK(t,
          strcmp(clattn_status_name(CL_INVALID_EVENT_WAIT_LIST), "CL_INVALID_EVENT_WAIT_LIST") == 0,
          "wait list");
    CHECK(t, strcmp(clattn_status_name(-2999), "CLATTN_UNKNOWN_STATUS") == 0, "unknown");
    CHECK(t, strcmp(clattn_status_name(CLATTN_SUCCESS), "CLATTN_SUCCESS") == 0, "success");
    CHECK(t, clattn_status_string(12345)[0] != '\0', "unknown statuses still get a message");
}

typedef struct log_capture {
    int calls, status;
    char message[256];
} log_capture;

static void capture(int status, const char *message, void *user) {
    log_capture *c = user;
    ++c->calls;
    c->status = status;
    strncpy(c->message, message, sizeof c->message - 1);
}

static void failures_reach_last_error_and_the_log_callback(test_ctx *t) {
    log_capture c = {0, 0, ""};
    clattn_set_log_callback(capture, &c);
    clattn_tensor nothing = {0};
    int status = clattn_copy(&nothing, NULL, &nothing, clattn_env_queue(t->env), 0, NULL, NULL);
    clattn_set_log_callback(NULL, NULL);
    CHECK(t, status == CLATTN_ERR_NULL_TENSOR, "status %s", clattn_status_name(status));
    CHECK(t, clattn_last_status() == status, "last status %d", clattn_last_status());
    CHECK(t, strstr(clattn_last_error(), "src") != NULL, "message names the argument: %s",
          clattn_last_error());
    CHECK(t, c.calls == 1 && c.status == status && strcmp(c.message, clattn_last_error()) == 0,
          "callback got %d calls, status %d, \"%s\"", c.calls, c.status, c.message);
}

static void a_long_message_is_cut_with_a_marker(test_ctx *t) {
    static char huge[70000];
    memset(huge, 'x', sizeof huge - 1);
    clattn__fail(CLATTN_ERR_BUILD_FAILED, "%s", huge);
    size_t n = strlen(clattn_last_error());
    CHECK(t, n > 1000 && n < sizeof huge, "length %zu", n);
    CHECK(t, strstr(clattn_last_error(), "(truncated)") != NULL, "no truncation marker");
}

static const test_case cases[] = {
    {"names_and_messages_are_unique", names_and_messages_are_unique},
    {"library_codes_stay_out_of_opencl_and_clblast_ranges",
     library_codes_stay_out_of_opencl_and_clblast_ranges},
    {"opencl_codes_pass_through_with_their_names", opencl_codes_pass_through_with_their_names},
    {"failures_reach_last_error_and_the_log_callback",
     failures_reach_last_error_and_the_log_callback},
    {"a_long_message_is_cut_with_a_marker", a_long_message_is_cut_with_a_marker},
};
SUITE_TAGGED(status_suite, "status", cases, TAG_HOST | TAG_SMOKE);
