/* Status table, per-thread failure detail, and the log callback. */
#include "status.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* OpenCL 1.2's own error codes, so a passed-through OpenCL status has a name too. */
#define CLATTN_CL_ERROR_TABLE(X)                                                                   \
    X(CL_DEVICE_NOT_FOUND)                                                                         \
    X(CL_DEVICE_NOT_AVAILABLE)                                                                     \
    X(CL_COMPILER_NOT_AVAILABLE)                                                                   \
    X(CL_MEM_OBJECT_ALLOCATION_FAILURE)                                                            \
    X(CL_OUT_OF_RESOURCES)                                                                         \
    X(CL_OUT_OF_HOST_MEMORY)                                                                       \
    X(CL_PROFILING_INFO_NOT_AVAILABLE)                                                             \
    X(CL_MEM_COPY_OVERLAP)                                                                         \
    X(CL_IMAGE_FORMAT_MISMATCH)                                                                    \
    X(CL_IMAGE_FORMAT_NOT_SUPPORTED)                                                               \
    X(CL_BUILD_PROGRAM_FAILURE)                                                                    \
    X(CL_MAP_FAILURE)                                                                              \
    X(CL_MISALIGNED_SUB_BUFFER_OFFSET)                                                             \
    X(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)                                                \
    X(CL_COMPILE_PROGRAM_FAILURE)                                                                  \
    X(CL_LINKER_NOT_AVAILABLE)                                                                     \
    X(CL_LINK_PROGRAM_FAILURE)                                                                     \
    X(CL_DEVICE_PARTITION_FAILED)                                                                  \
    X(CL_KERNEL_ARG_INFO_NOT_AVAILABLE)                                                            \
    X(CL_INVALID_VALUE)                                                                            \
    X(CL_INVALID_DEVICE_TYPE)                                                                      \
    X(CL_INVALID_PLATFORM)                                                                         \
    X(CL_INVALID_DEVICE)                                                                           \
    X(CL_INVALID_CONTEXT)                                                                          \
    X(CL_INVALID_QUEUE_PROPERTIES)                                                                 \
    X(CL_INVALID_COMMAND_QUEUE)                                                                    \
    X(CL_INVALID_HOST_PTR)                                                                         \
    X(CL_INVALID_MEM_OBJECT)                                                                       \
    X(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR)                                                          \
    X(CL_INVALID_IMAGE_SIZE)                                                                       \
    X(CL_INVALID_SAMPLER)                                                                          \
    X(CL_INVALID_BINARY)                                                                           \
    X(CL_INVALID_BUILD_OPTIONS)                                                                    \
    X(CL_INVALID_PROGRAM)                                                                          \
    X(CL_INVALID_PROGRAM_EXECUTABLE)                                                               \
    X(CL_INVALID_KERNEL_NAME)                                                                      \
    X(CL_INVALID_KERNEL_DEFINITION)                                                                \
    X(CL_INVALID_KERNEL)                                                                           \
    X(CL_INVALID_ARG_INDEX)                                                                        \
    X(CL_INVALID_ARG_VALUE)                                                                        \
    X(CL_INVALID_ARG_SIZE)                                                                         \
    X(CL_INVALID_KERNEL_ARGS)                                                                      \
    X(CL_INVALID_WORK_DIMENSION)                                                                   \
    X(CL_INVALID_WORK_GROUP_SIZE)                                                                  \
    X(CL_INVALID_WORK_ITEM_SIZE)                                                                   \
    X(CL_INVALID_GLOBAL_OFFSET)                                                                    \
    X(CL_INVALID_EVENT_WAIT_LIST)                                                                  \
    X(CL_INVALID_EVENT)                                                                            \
    X(CL_INVALID_OPERATION)                                                                        \
    X(CL_INVALID_GL_OBJECT)                                                                        \
    X(CL_INVALID_BUFFER_SIZE)                                                                      \
    X(CL_INVALID_MIP_LEVEL)                                                                        \
    X(CL_INVALID_GLOBAL_WORK_SIZE)                                                                 \
    X(CL_INVALID_PROPERTY)                                                                         \
    X(CL_INVALID_IMAGE_DESCRIPTOR)                                                                 \
    X(CL_INVALID_COMPILER_OPTIONS)                                                                 \
    X(CL_INVALID_LINKER_OPTIONS)                                                                   \
    X(CL_INVALID_DEVICE_PARTITION_COUNT)

const char *clattn_status_name(int status) {
    switch (status) {
#define CLATTN_NAME_CASE(name, value, message)                                                     \
    case value:                                                                                    \
        return #name;
        CLATTN_STATUS_TABLE(CLATTN_NAME_CASE)
#undef CLATTN_NAME_CASE
#define CLATTN_CL_NAME_CASE(name)                                                                  \
    case name:                                                                                     \
        return #name;
        CLATTN_CL_ERROR_TABLE(CLATTN_CL_NAME_CASE)
#undef CLATTN_CL_NAME_CASE
    default:
        return "CLATTN_UNKNOWN_STATUS";
    }
}

const char *clattn_status_string(int status) {
    switch (status) {
#define CLATTN_STRING_CASE(name, value, message)                                                   \
    case value:                                                                                    \
        return message;
        CLATTN_STATUS_TABLE(CLATTN_STRING_CASE)
#undef CLATTN_STRING_CASE
    default:
        break;
    }
    if (status < 0 && status > -100) return "OpenCL error (see the OpenCL specification)";
    if (status <= -1000 && status > -1024) return "OpenCL extension error";
    return "unknown status";
}

/* ---- per-thread failure detail ---- */

/* Large enough for the first screens of a build log; longer logs are cut with a marker. */
#define CLATTN_ERROR_CAPACITY 32768

static _Thread_local char last_message[CLATTN_ERROR_CAPACITY];
static _Thread_local int last_status;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static clattn_log_fn log_fn;
static void *log_user;

void clattn_set_log_callback(clattn_log_fn fn, void *user) {
    pthread_mutex_lock(&log_lock);
    log_fn = fn;
    log_user = user;
    pthread_mutex_unlock(&log_lock);
}

/* The callback runs under the lock: once clattn_set_log_callback(NULL, NULL) returns, the old
 * callback is not running anywhere, so its `user` data may be freed. */
static void send_to_log(int status, const char *message) {
    pthread_mutex_lock(&log_lock);
    if (log_fn) log_fn(status, message, log_user);
    pthread_mutex_unlock(&log_lock);
}

static void format_into(char *buffer, size_t capacity, const char *fmt, va_list args) {
    int n = vsnprintf(buffer, capacity, fmt, args);
    static const char marker[] = "\n... (truncated)";
    if (n >= 0 && (size_t)n >= capacity)
        memcpy(buffer + capacity - sizeof marker, marker, sizeof marker);
}

int clattn__fail(int status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    format_into(last_message, sizeof last_message, fmt, args);
    va_end(args);
    last_status = status;
    send_to_log(status, last_message);
    return status;
}

int clattn__cl_fail(cl_int err, const char *what) {
    return clattn__fail(err, "%s failed: %s (%d)", what, clattn_status_name(err), err);
}

void clattn__warn(const char *fmt, ...) {
    char message[1024];
    va_list args;
    va_start(args, fmt);
    format_into(message, sizeof message, fmt, args);
    va_end(args);
    send_to_log(CLATTN_SUCCESS, message);
}

void clattn__clear_error(void) {
    last_message[0] = '\0';
    last_status = CLATTN_SUCCESS;
}

const char *clattn_last_error(void) {
    return last_message;
}

int clattn_last_status(void) {
    return last_status;
}
