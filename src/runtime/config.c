/*
 * Configuration read from the environment at each call (never cached, so a test or a user can
 * change it between calls).
 */
#include "config.h"
#include "status.h"

#include <stdint.h>
#include <stdlib.h>

/* A decimal integer in [low, high] from `text`, or the caller's "no cap" when text is NULL or
 * empty; `name` is the variable, for the message. */
static int parse_cap(const char *name, const char *text, unsigned long long low,
                     unsigned long long high, unsigned long long *value) {
    if (!text || !*text) return CLATTN_SUCCESS;
    unsigned long long v = 0;
    const char *p = text;
    while (*p >= '0' && *p <= '9' && v <= high) v = v * 10 + (unsigned long long)(*p++ - '0');
    if (*p || v < low || v > high)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                            "%s=\"%.64s\" is not a decimal integer in [%llu, %llu]", name, text,
                            low, high);
    *value = v;
    return CLATTN_SUCCESS;
}

int clattn__parse_group_cap(const char *text, size_t *cap) {
    unsigned long long value = SIZE_MAX;
    int status = parse_cap("CLATTN_MAX_WORK_GROUP", text, 1, 65536, &value);
    *cap = status == CLATTN_SUCCESS ? (size_t)value : SIZE_MAX;
    return status;
}

int clattn__group_cap(size_t *cap) {
    return clattn__parse_group_cap(getenv("CLATTN_MAX_WORK_GROUP"), cap);
}

int clattn__local_memory_cap(cl_ulong *cap) {
    unsigned long long value = CL_ULONG_MAX;
    int status = parse_cap("CLATTN_MAX_LOCAL_MEMORY", getenv("CLATTN_MAX_LOCAL_MEMORY"), 1024,
                           1ull << 30, &value);
    *cap = status == CLATTN_SUCCESS ? (cl_ulong)value : CL_ULONG_MAX;
    return status;
}
