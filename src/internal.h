/* Internal interfaces shared by the library's runtime pieces and op files (not installed). */
#ifndef CLATTN_INTERNAL_H
#define CLATTN_INTERNAL_H

#include "clattn.h"

#include <stdarg.h>
#include <stdbool.h>

#if defined(__GNUC__)
#define CLATTN_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define CLATTN_PRINTF(fmt, args)
#endif

/* ---- status.c: failure detail for clattn_last_error() and the log callback ---- */

/* Records `status` with a formatted detail for this thread, sends it to the log callback, and
 * returns `status`, so that a check reads `return clattn__fail(CLATTN_ERR_..., "...", ...)`. */
int clattn__fail(int status, const char *fmt, ...) CLATTN_PRINTF(2, 3);
/* Records an OpenCL error from `what` ("clEnqueueNDRangeKernel"); returns it unchanged. */
int clattn__cl_fail(cl_int err, const char *what);
/* Sends a warning to the log callback (status CLATTN_SUCCESS); does not touch the last error. */
void clattn__warn(const char *fmt, ...) CLATTN_PRINTF(1, 2);
/* Clears this thread's last error; each public entry point calls it first. */
void clattn__clear_error(void);

/* ---- tensor.c: the tensor-descriptor validator ---- */

enum {
    CLATTN__FLOAT_DTYPES = (1u << CLATTN_F32) | (1u << CLATTN_F16) | (1u << CLATTN_BF16),
};

/* Offset of the last element the view addresses, relative to the buffer start (elements). */
uint64_t clattn__tensor_last_element(const clattn_tensor *t);

/* Validates one tensor descriptor for a call on `context`:
 * non-NULL descriptor and buffer, dtype in `dtype_mask`, every dim > 0, every stride >= 0, the
 * view inside CL_MEM_SIZE, the buffer in `context`. Outputs (`is_output`) must also not overlap
 * themselves (no stride 0 on a dim > 1, no interleaved dims). `name` is used in the message. */
int clattn__check_tensor(const char *name, const clattn_tensor *t, cl_context context,
                         unsigned dtype_mask, bool is_output);
/* Both tensors have the same shape. */
int clattn__check_same_shape(const char *name_a, const clattn_tensor *a, const char *name_b,
                             const clattn_tensor *b);
/* The shapes of an attention-like op: q [B,Hq,Sq,D], k [B,Hkv,Sk,D], v [B,Hkv,Sk,Dv],
 * out [B,Hq,Sq,Dv] with Hq % Hkv == 0 (CLATTN_ERR_SHAPE_MISMATCH), and D, Dv at most
 * max_head_dim (CLATTN_ERR_DEVICE_LIMIT). */
int clattn__check_attention_shapes(const clattn_tensor *q, const clattn_tensor *k,
                                   const clattn_tensor *v, const clattn_tensor *out,
                                   int64_t max_head_dim);
/* An output's addressed byte range does not overlap an input's in the same buffer. */
int clattn__check_no_alias(const char *out_name, const clattn_tensor *out, const char *in_name,
                           const clattn_tensor *in);
/* The OpenCL tail of one enqueueing call, with the queue's context and device. */
typedef struct clattn__call {
    cl_command_queue queue;
    cl_context context;
    cl_device_id device;
    cl_uint num_wait;
    const cl_event *wait_list;
    cl_event *event; /* may be NULL */
} clattn__call;

/* The first step of every enqueueing entry point: clears this thread's last error, sets *event
 * to NULL (so every failure leaves it NULL), checks that the queue is valid and the wait list
 * consistent, and fills `call`. */
int clattn__begin_call(clattn__call *call, cl_command_queue queue, cl_uint num_wait,
                       const cl_event *wait_list, cl_event *event);

/* ---- program.c: the program cache and kernel launch ---- */

/* A kernel ready for arguments, from the cached program of `op_file` ("heads.cl") built with
 * `options` for `device`. The caller releases the kernel (it is never shared, so setting its
 * arguments is thread-safe). */
int clattn__create_kernel(cl_context context, cl_device_id device, const char *op_file,
                          const char *options, const char *kernel_name, cl_kernel *kernel);

/* clSetKernelArg with the failure recorded. */
int clattn__set_arg(cl_kernel kernel, cl_uint index, size_t size, const void *value);
/* An index argument: cl_uint when `wide` is false, cl_ulong otherwise (the kernel's IDX). */
int clattn__set_idx_arg(cl_kernel kernel, cl_uint index, uint64_t value, bool wide);

/* The largest work-group size this kernel supports on this device (CL_KERNEL_WORK_GROUP_SIZE),
 * never more than the device's per-dimension limit for dimension 0. */
int clattn__kernel_max_group(cl_kernel kernel, cl_device_id device, size_t *size);

/* CLATTN_MAX_WORK_GROUP, when set, caps every work-group clattn launches (its own kernels; not
 * CLBlast's): a knob for drivers whose large groups misbehave, and how CI runs a lane with
 * small groups. `text` must be a decimal integer in [1, 65536]; *cap is SIZE_MAX when `text` is
 * NULL or empty. CLATTN_ERR_INVALID_ARGUMENT otherwise. */
int clattn__parse_group_cap(const char *text, size_t *cap);
/* The cap CLATTN_MAX_WORK_GROUP sets now (SIZE_MAX when unset); a malformed value fails. */
int clattn__group_cap(size_t *cap);

/* Head-dim vector lanes for the row kernels (cl/rows.cl): `width` (the tuning table's LANES)
 * as 16, 8, 4 or 1, narrowed until it divides both head dims; 1 (scalar code) for odd head dims
 * or a width below 4. */
int clattn__head_lanes(cl_uint width, int64_t d, int64_t dv);

/* A tensor argument as the kernels take it: buffer, offset, then the strides of dims first..3. */
int clattn__set_view_args(cl_kernel kernel, cl_uint *arg, const clattn_tensor *t, int first,
                          bool wide);

/* clEnqueueNDRangeKernel on the call's queue, after its wait list, into its event; the failure
 * recorded. */
int clattn__enqueue(const clattn__call *call, cl_kernel kernel, cl_uint dims, const size_t *global,
                    const size_t *local);

/* Calls that enqueue several steps (the composed attention path, MHA) wrap them so: a barrier
 * on the call's wait list first (nothing when it is empty), a barrier between dependent steps
 * on an out-of-order queue (an in-order one orders them already), and a marker into the call's
 * event last (nothing when event is NULL). Each records its failure. */
bool clattn__queue_out_of_order(cl_command_queue queue);
int clattn__steps_begin(const clattn__call *call);
int clattn__steps_boundary(const clattn__call *call, bool out_of_order);
int clattn__steps_end(const clattn__call *call);

/* Kernels index with 32-bit integers when every element offset of a call is below this limit
 * (2^31, so that an offset plus a run or a size still fits in 32 bits), and with 64-bit ones
 * otherwise. Tests lower it to exercise the 64-bit path on small tensors. */
extern uint64_t clattn__narrow_index_limit;
/* Some of the views (NULL entries are skipped) reaches the limit: the call needs 64-bit IDX. */
bool clattn__needs_wide_index(const clattn_tensor *const *views, size_t count);

/* Softmax kernel variants (cl/softmax.cl); tests force one to run both on any device. */
enum { CLATTN__SOFTMAX_ROWS = 0, CLATTN__SOFTMAX_GROUP = 1 };
extern int clattn__softmax_variant_override; /* -1: chosen by device type */

/* Fused attention kernel variants (cl/attention.cl); tests force each one on any device. */
enum { CLATTN__ATTENTION_BLOCKS = 0, CLATTN__ATTENTION_TILES = 1, CLATTN__ATTENTION_KEYS = 2 };
extern int clattn__attention_variant_override; /* -1: chosen by device type and shape */
extern int clattn__attention_splits_override;  /* > 0: split the keys that many ways */

/* Linear attention launch rows (the tuning table's "default" and "type:gpu" rows); tests force
 * each one on any device. */
enum { CLATTN__LINEAR_CPU = 0, CLATTN__LINEAR_GPU = 1 };
extern int clattn__linear_launch_override; /* -1: chosen by device type */

/* ---- program.c <-> program_binary.c: program binaries ----
 * program_binary.c serializes cached programs (clattn_cache_export/import) and keeps the opt-in
 * on-disk cache (CLATTN_CACHE_DIR); program.c owns the cache these read and fill. A program's
 * text hash is the FNV-1a 64 hash of the full source text it is built from (embedded or not),
 * which is what a binary is checked against. */

/* A cached program as export sees it: retained, with copies of its key. */
typedef struct clattn__cached_program {
    cl_program program;
    char *op_file, *options;
    uint64_t text_hash;
} clattn__cached_program;
/* The programs cached for (context, device), each retained, in a malloc'ed *list (NULL when
 * *count is 0). Statuses: CLATTN_SUCCESS, CLATTN_ERR_OUT_OF_HOST_MEMORY. */
int clattn__cache_snapshot(cl_context context, cl_device_id device, clattn__cached_program **list,
                           size_t *count);
void clattn__cache_snapshot_free(clattn__cached_program *list, size_t count);
/* The cache key and the text hash that the next build of `op_file` would have. Statuses:
 * clattn__program_source's. */
int clattn__program_hashes(const char *op_file, uint64_t *key, uint64_t *text_hash);
/* Adds a program made from a binary (the cache takes the caller's reference) under `key`; not a
 * build for clattn_cache_stats. False, with the program released, when that key is cached
 * already or memory runs out. */
bool clattn__cache_adopt(cl_context context, cl_device_id device, const char *op_file,
                         const char *options, uint64_t key, uint64_t text_hash, cl_program program);

/* The parsing clattn_cache_import does before it compares an entry with the device and hands
 * its binary to the driver: the entries of data[0, size) it can step over (*corrupt of them
 * with a wrong checksum or strings), and the bytes they take. For the fuzz target, which must
 * not give forged binaries to a driver (README, Known limits). */
size_t clattn__cache_blob_scan(const void *data, size_t size, size_t *entries, size_t *corrupt);

/* The on-disk cache, when CLATTN_CACHE_DIR is set (read at each call; unset: both do nothing).
 * load: true with a built program in *out when <dir>/<hash>.clbin holds a valid entry for this
 * device identity, options and text; anything else is a miss (false). store: writes the entry
 * for a program just built, atomically (a temporary file renamed over the name); a failure is a
 * clattn__warn, never an error. Neither records a last error. */
bool clattn__disk_cache_load(cl_context context, cl_device_id device, const char *op_file,
                             const char *options, uint64_t text_hash, cl_program *out);
void clattn__disk_cache_store(cl_device_id device, const char *op_file, const char *options,
                              uint64_t text_hash, cl_program program);

/* ---- end of program binaries ---- */

/* ---- fault.c: fault injection, for the tests only ---- */

/* The places a test can make fail: a program build (the source gets an #error, so the driver's
 * real failure path and log run), the library's scratch allocation (as
 * CL_MEM_OBJECT_ALLOCATION_FAILURE), and a CLBlast GEMM (as CLBlast's own error code). */
typedef enum clattn__fault_site {
    CLATTN__FAULT_BUILD,
    CLATTN__FAULT_ALLOC,
    CLATTN__FAULT_BLAS,
    CLATTN__FAULT_SITES
} clattn__fault_site;
/* Arms `site` to fail at its n-th use from now (n >= 1), once; n = 0 disarms it. */
void clattn__fault_arm(clattn__fault_site site, int n);
/* Counts one use of `site`: true when it is the armed one (which disarms it). */
bool clattn__fault_hit(clattn__fault_site site);
/* Scratch buffers the library has allocated and OpenCL has not yet destroyed (the tests check
 * that a failing call leaks none). */
long clattn__scratch_live(void);

/* ---- small helpers ---- */

/* Smallest power of two >= n (n >= 1), capped at `cap`. */
size_t clattn__pow2_at_least(size_t n, size_t cap);
/* n rounded up to a multiple of m (m > 0). */
size_t clattn__round_up(size_t n, size_t m);

#endif
