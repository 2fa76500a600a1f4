/* Configuration read from the environment at each call. Not installed. */
#ifndef CLATTN_RUNTIME_CONFIG_H
#define CLATTN_RUNTIME_CONFIG_H

#include "status.h"

#include <stddef.h>

/* CLATTN_MAX_WORK_GROUP, when set, caps every work-group clattn launches (its own kernels; not
 * CLBlast's): a knob for drivers whose large groups misbehave, and how CI runs a lane with
 * small groups. `text` must be a decimal integer in [1, 65536]; *cap is SIZE_MAX when `text` is
 * NULL or empty. CLATTN_ERR_INVALID_ARGUMENT otherwise. */
int clattn__parse_group_cap(const char *text, size_t *cap);
/* The cap CLATTN_MAX_WORK_GROUP sets now (SIZE_MAX when unset); a malformed value fails. */
int clattn__group_cap(size_t *cap);
/* CLATTN_MAX_LOCAL_MEMORY, when set, caps the local memory (bytes, in [1024, 2^30]) clattn plans
 * its kernels for: how CI dumps the programs a GPU with that much would build (the compile
 * lane) on a CPU device that has more. *cap is CL_ULONG_MAX when unset; a malformed value
 * fails. */
int clattn__local_memory_cap(cl_ulong *cap);

#endif
