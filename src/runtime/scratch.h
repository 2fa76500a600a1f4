/* The library's scratch buffers and callers' workspaces. Not installed. */
#ifndef CLATTN_RUNTIME_SCRATCH_H
#define CLATTN_RUNTIME_SCRATCH_H

#include "status.h"
#include "tensor.h"

/* A device buffer of `bytes` for the library's own scratch, counted by
 * clattn_scratch_peak_bytes. The caller releases it (OpenCL defers the release until the
 * commands that use it are done). */
int clattn__scratch_alloc(cl_context context, size_t bytes, cl_mem *out);

/* The scratch of a call that needs `bytes` (0: none, *out is `workspace` as given): the
 * caller's `workspace`, once checked (in `context`, at least `bytes`, not read-only, apart from
 * each of the call's `tensors` that has a buffer), or a fresh buffer, *owned, for the caller to
 * release after enqueueing. */
int clattn__get_workspace(cl_mem workspace, size_t bytes, cl_context context,
                          const clattn__tensor_list *tensors, cl_mem *out, bool *owned);

#endif
