/* Build options appended as " -DMACRO=VALUE" without snprintf: a call formats thirty or so, and
 * through snprintf they took a fifth of an attention call's host instructions (callgrind on
 * PoCL). Not installed. */
#ifndef CLATTN_RUNTIME_BUILD_OPTIONS_H
#define CLATTN_RUNTIME_BUILD_OPTIONS_H

#include <stddef.h>

/* Append " -D<macro>=<value>" at out[*used] and advance *used, or, where it does not fit in
 * `capacity` with its terminator, leave out as it was and set *used to capacity, so that no
 * later call with the same *used appends either (a caller that takes strlen(out) again could;
 * the callers' buffers hold about twice what they append: an attention call's options take
 * about 600 of 1024 bytes). */
void clattn__define_int(char *out, size_t capacity, size_t *used, const char *macro,
                        long long value);
void clattn__define_str(char *out, size_t capacity, size_t *used, const char *macro,
                        const char *value);

#endif
