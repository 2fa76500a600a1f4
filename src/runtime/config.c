/*
 * Configuration read from the environment at each call (never cached, so a test or a user can
 * change it between calls).
 */
#include "config.h"
#include "status.h"

#include <stdlib.h>

int clattn__parse_group_cap(const char *text, size_t *cap) {
    *cap = SIZE_MAX;
    if (!text || !*text) return CLATTN_SUCCESS;
    unsigned long value = 0;
    const char *p = text;
    while (*p >= '0' && *p <= '9' && value <= 65536)
        value = value * 10 + (unsigned long)(*p++ - '0');
    if (*p || value < 1 || value > 65536)
        return clattn__fail(
            CLATTN_ERR_INVALID_ARGUMENT,
            "CLATTN_MAX_WORK_GROUP=\"%.64s\" is not a work-group size in [1, 65536]", text);
    *cap = value;
    return CLATTN_SUCCESS;
}

int clattn__group_cap(size_t *cap) {
    return clattn__parse_group_cap(getenv("CLATTN_MAX_WORK_GROUP"), cap);
}
