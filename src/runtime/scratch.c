/*
 * The library's scratch buffers (counted for clattn_scratch_peak_bytes and, for the tests, until
 * OpenCL destroys them) and the check of a caller's workspace.
 */
#include "scratch.h"
#include "hooks.h"
#include "tensor.h"
#include "testing.h"

#include <pthread.h>
#include <stdatomic.h>

static pthread_mutex_t scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t scratch_peak;
static atomic_long scratch_live;

/* OpenCL calls this when it destroys a scratch buffer: after the last release and the last
 * command that uses it. */
static void CL_CALLBACK scratch_destroyed(cl_mem buffer, void *user) {
    (void)buffer;
    (void)user;
    atomic_fetch_sub(&scratch_live, 1);
}

long clattn__scratch_live(void) {
    return atomic_load(&scratch_live);
}

int clattn__scratch_alloc(cl_context context, size_t bytes, cl_mem *out) {
    cl_int err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
    *out = clattn__fault_hit(CLATTN__FAULT_ALLOC)
               ? NULL
               : clCreateBuffer(context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS) {
        *out = NULL;
        return clattn__cl_fail(err, "clCreateBuffer (the call's scratch)");
    }
    atomic_fetch_add(&scratch_live, 1);
    if (clSetMemObjectDestructorCallback(*out, scratch_destroyed, NULL) != CL_SUCCESS)
        atomic_fetch_sub(&scratch_live, 1); /* uncounted rather than counted forever */
    pthread_mutex_lock(&scratch_lock);
    if (bytes > scratch_peak) scratch_peak = bytes;
    pthread_mutex_unlock(&scratch_lock);
    return CLATTN_SUCCESS;
}

size_t clattn_scratch_peak_bytes(int reset) {
    pthread_mutex_lock(&scratch_lock);
    size_t peak = scratch_peak;
    if (reset) scratch_peak = 0;
    pthread_mutex_unlock(&scratch_lock);
    return peak;
}

/* The caller's workspace must be writable and apart from every tensor of the call: it is
 * checked as an f32 view of the whole buffer. */
static int check_workspace(cl_mem workspace, size_t bytes, cl_context context,
                           const clattn__tensor_list *tensors) {
    size_t size = 0;
    cl_context owner = NULL;
    cl_mem_flags flags = 0;
    clGetMemObjectInfo(workspace, CL_MEM_SIZE, sizeof size, &size, NULL);
    clGetMemObjectInfo(workspace, CL_MEM_CONTEXT, sizeof owner, &owner, NULL);
    clGetMemObjectInfo(workspace, CL_MEM_FLAGS, sizeof flags, &flags, NULL);
    if (owner != context)
        return clattn__fail(CLATTN_ERR_CONTEXT_MISMATCH, "the workspace is in another context");
    if (size < bytes)
        return clattn__fail(CLATTN_ERR_BUFFER_TOO_SMALL,
                            "the workspace holds %zu bytes; this call needs %zu", size, bytes);
    if (flags & CL_MEM_READ_ONLY)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "the workspace is CL_MEM_READ_ONLY");
    clattn_tensor whole = clattn_tensor_4d(workspace, CLATTN_F32, 1, 1, 1, (int64_t)(size / 4));
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < tensors->count && status == CLATTN_SUCCESS; ++i)
        if (tensors->views[i]->buffer)
            status =
                clattn__check_no_alias("workspace", &whole, tensors->names[i], tensors->views[i]);
    return status;
}

int clattn__get_workspace(cl_mem workspace, size_t bytes, cl_context context,
                          const clattn__tensor_list *tensors, cl_mem *out, bool *owned) {
    *out = workspace;
    *owned = false;
    /* checked even where this call needs none: whether a call is refused must not depend on the
     * plan the device's tuning made (a GPU's split keys need scratch where a CPU's call needs
     * none) */
    if (workspace) return check_workspace(workspace, bytes, context, tensors);
    if (bytes == 0) return CLATTN_SUCCESS;
    *owned = true;
    return clattn__scratch_alloc(context, bytes, out);
}
