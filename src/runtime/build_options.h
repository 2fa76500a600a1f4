/* Build options appended as " -DMACRO=VALUE" without snprintf: a call formats thirty or so, and
 * through snprintf they took a fifth of an attention call's host instructions (callgrind on
 * PoCL). Not installed. */
#ifndef CLATTN_RUNTIME_BUILD_OPTIONS_H
#define CLATTN_RUNTIME_BUILD_OPTIONS_H

#include <stddef.h>

/* Append " -D<macro>=<value>" at out[*used] and advance *used, or, where it does not fit in
 * `capacity` with its terminator, leave out as it was and set *used to capacity, so that
 * nothing after it is appended either (the callers' buffers hold several times what they
 * append). */
void clattn__define_int(char *out, size_t capacity, size_t *used, const char *macro,
                        long long value);
void clattn__define_str(char *out, size_t capacity, size_t *used, const char *macro,
                        const char *value);

#endif
