/*
 * clattn: transformer-attention primitives for any OpenCL device.
 *
 * Conventions (CLBlast's, with its users' complaints fixed):
 *  - The caller owns every cl_mem, queue and event. Every enqueueing call ends with OpenCL's own
 *    tail `queue, num_wait, wait_list, event`. `event` may be NULL; an event returned through it
 *    is the caller's to release; on any failure `*event` is set to NULL.
 *  - Every call validates all of its arguments before its first enqueue. Invalid input returns a
 *    specific status, enqueues nothing and writes nothing. The detail (which argument, which
 *    bound, the build log) is kept by clattn_last_error() and sent to the log callback.
 *  - The library never prints, never exits, never aborts.
 *  - Calls on different queues from different threads are safe; caches take a lock.
 */
#ifndef CLATTN_H
#define CLATTN_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(CLATTN_BUILDING_SHARED)
#define CLATTN_API __declspec(dllexport)
#elif defined(__GNUC__)
#define CLATTN_API __attribute__((visibility("default")))
#else
#define CLATTN_API
#endif

#define CLATTN_VERSION_MAJOR 0
#define CLATTN_VERSION_MINOR 1
#define CLATTN_VERSION_PATCH 0

/* ---------------------------------------------------------------------------------------------
 * Status codes
 *
 * A clattn_status is either CLATTN_SUCCESS (0), an OpenCL error code passed through with its own
 * number (CL_OUT_OF_RESOURCES, CL_INVALID_COMMAND_QUEUE, ...), or one of the library's own codes
 * below, which live in the range -3000..-3099 so they never collide with OpenCL's (0..-72, plus
 * extension codes around -1000) or CLBlast's (-1024..-2048).
 * ------------------------------------------------------------------------------------------- */
#define CLATTN_STATUS_TABLE(X)                                                                     \
    X(CLATTN_SUCCESS, 0, "success")                                                                \
    X(CLATTN_ERR_INVALID_ARGUMENT, -3000,                                                          \
      "invalid argument (a NULL pointer or a value out of range)")                                 \
    X(CLATTN_ERR_NULL_TENSOR, -3001, "a required tensor has no buffer")                            \
    X(CLATTN_ERR_INVALID_SHAPE, -3002, "a tensor dimension is zero or negative")                   \
    X(CLATTN_ERR_SHAPE_MISMATCH, -3003, "tensor shapes do not agree with each other")              \
    X(CLATTN_ERR_INVALID_STRIDES, -3004, "a stride is negative, or an output overlaps itself")     \
    X(CLATTN_ERR_UNSUPPORTED_DTYPE, -3005, "this dtype or dtype pair is not supported here")       \
    X(CLATTN_ERR_BUFFER_TOO_SMALL, -3006, "a tensor view reaches past the end of its buffer")      \
    X(CLATTN_ERR_ALIASING, -3007, "an output overlaps an input in a way this op does not allow")   \
    X(CLATTN_ERR_CONTEXT_MISMATCH, -3008, "a buffer belongs to another context than the queue")    \
    X(CLATTN_ERR_DEVICE_NOT_FOUND, -3009, "no OpenCL device matches the request")                  \
    X(CLATTN_ERR_INVALID_DEVICE_SPEC, -3010, "the device spec is malformed")                       \
    X(CLATTN_ERR_KERNEL_SOURCE, -3011, "a kernel source file could not be read")                   \
    X(CLATTN_ERR_BUILD_FAILED, -3012, "the OpenCL program failed to build (see the build log)")    \
    X(CLATTN_ERR_DEVICE_LIMIT, -3013, "the call exceeds a limit of the device")                    \
    X(CLATTN_ERR_OUT_OF_HOST_MEMORY, -3014, "host memory allocation failed")                       \
    X(CLATTN_ERR_BLAS, -3015, "CLBlast returned an error (its code is in clattn_last_error())")    \
    X(CLATTN_ERR_INVALID_TUNING, -3016, "a tuning override is malformed or does not fit the device")

typedef enum clattn_status {
#define CLATTN_STATUS_ENUM(name, value, message) name = value,
    CLATTN_STATUS_TABLE(CLATTN_STATUS_ENUM)
#undef CLATTN_STATUS_ENUM
} clattn_status;

/* "CLATTN_ERR_SHAPE_MISMATCH", "CL_OUT_OF_RESOURCES", or "CLATTN_UNKNOWN_STATUS". */
CLATTN_API const char *clattn_status_name(int status);
/* A one-line description of the status. Never NULL. */
CLATTN_API const char *clattn_status_string(int status);

/* The detail of the last failure on the calling thread (argument, bound, build log). Every call
 * that returns a status clears it as it starts, so it is "" after a call that succeeded. The
 * pointer stays valid until the next clattn call on this thread. */
CLATTN_API const char *clattn_last_error(void);
/* Status of that last failure (CLATTN_SUCCESS when none). */
CLATTN_API int clattn_last_status(void);

/* Optional log sink: receives every failure detail (and warnings) from any thread, one call at a
 * time. Pass NULL to remove it; once that returns, the old callback is not running anywhere. The
 * callback must not call back into clattn. */
typedef void (*clattn_log_fn)(int status, const char *message, void *user);
CLATTN_API void clattn_set_log_callback(clattn_log_fn fn, void *user);

/* ---------------------------------------------------------------------------------------------
 * Tensors
 *
 * A tensor is a plain descriptor of a strided 4-D view into a caller-owned cl_mem. Shape is
 * outermost-first; strides and offset count elements, not bytes. Stride 0 broadcasts (inputs
 * only). Lower-rank tensors put 1 in the leading dimensions: a [B,S,E] tensor has shape
 * {1,B,S,E}. Any permuted layout is a permutation of shape and strides, no copy needed.
 * ------------------------------------------------------------------------------------------- */
typedef enum clattn_dtype {
    CLATTN_F32 = 0,  /* float */
    CLATTN_F16 = 1,  /* IEEE half, storage only (compute is f32) */
    CLATTN_BF16 = 2, /* bfloat16, storage only, round-to-nearest-even on store */
    CLATTN_I32 = 3,  /* lengths */
    CLATTN_U8 = 4    /* boolean masks */
} clattn_dtype;

typedef struct clattn_tensor {
    cl_mem buffer;
    size_t offset; /* in elements */
    clattn_dtype dtype;
    int64_t shape[4];
    int64_t strides[4]; /* in elements; 0 broadcasts */
} clattn_tensor;

/* Size in bytes of one element of `dtype`, 0 for an unknown dtype. */
CLATTN_API size_t clattn_dtype_size(clattn_dtype dtype);
/* "f32", "f16", "bf16", "i32", "u8", or "?" */
CLATTN_API const char *clattn_dtype_name(clattn_dtype dtype);

/* A contiguous (row-major) view of shape {d0,d1,d2,d3} at offset 0. */
CLATTN_API clattn_tensor clattn_tensor_4d(cl_mem buffer, clattn_dtype dtype, int64_t d0, int64_t d1,
                                          int64_t d2, int64_t d3);
/* The same view with its dimensions reordered: result dim i is input dim perm[i]. `perm` must be
 * a permutation of 0..3; otherwise the input is returned unchanged. */
CLATTN_API clattn_tensor clattn_tensor_permute(clattn_tensor t, const int perm[4]);
/* Number of elements the view addresses (product of the shape); 0 for a non-positive dim or a
 * product past INT64_MAX. */
CLATTN_API int64_t clattn_tensor_numel(const clattn_tensor *t);

/* ---------------------------------------------------------------------------------------------
 * Devices and the convenience environment
 *
 * A device spec is "P:D" (platform and device index), or a case-insensitive substring of the
 * platform or device name ("pocl", "nvidia", "gfx1100", "pthread"). NULL or "" means: the value
 * of the CLATTN_DEVICE environment variable if set, else the first GPU, else the first device.
 * ------------------------------------------------------------------------------------------- */
typedef struct clattn_device_desc {
    int platform_index;
    int device_index;
    cl_platform_id platform;
    cl_device_id device;
    cl_device_type type;
    char platform_name[128];
    char name[128];
    char vendor[128];
    char version[128]; /* CL_DEVICE_VERSION */
    char driver[64];   /* CL_DRIVER_VERSION */
} clattn_device_desc;

/* Fills up to `capacity` descriptors (out may be NULL when capacity is 0) and stores the total
 * number of devices in *count. Statuses: CLATTN_SUCCESS, CLATTN_ERR_INVALID_ARGUMENT, OpenCL's. */
CLATTN_API int clattn_list_devices(clattn_device_desc *out, size_t capacity, size_t *count);
/* Resolves a device spec (see above). Statuses: CLATTN_SUCCESS, CLATTN_ERR_DEVICE_NOT_FOUND,
 * CLATTN_ERR_INVALID_DEVICE_SPEC, CLATTN_ERR_INVALID_ARGUMENT, OpenCL's. */
CLATTN_API int clattn_select_device(const char *spec, clattn_device_desc *out);

/* The convenience environment: one device, a context, an in-order queue. Ops take its queue like
 * any other: clattn_split_heads(..., clattn_env_queue(env), 0, NULL, NULL). */
typedef struct clattn_env clattn_env;

/* Statuses: those of clattn_select_device, plus OpenCL's from context/queue creation. */
CLATTN_API int clattn_env_create(const char *spec, clattn_env **out);
/* An environment over the caller's queue (any OpenCL queue: PyOpenCL's, a framework's): the
 * queue and its context are retained, the device is the queue's (its indices -1 when no platform
 * lists it, a sub-device). Allocations land in the queue's context, transfers go through the
 * queue. Statuses: CLATTN_SUCCESS, CLATTN_ERR_INVALID_ARGUMENT (out NULL), CL_INVALID_COMMAND_QUEUE
 * (queue NULL), OpenCL's from the queries. */
CLATTN_API int clattn_env_wrap(cl_command_queue queue, clattn_env **out);
/* Waits for the queue, then releases queue and context. An environment of clattn_env_create also
 * releases the programs cached for its context (clattn_cache_clear); one of clattn_env_wrap leaves
 * them to the context's owner, who may still use the context. NULL is allowed. */
CLATTN_API void clattn_env_release(clattn_env *env);
CLATTN_API cl_context clattn_env_context(const clattn_env *env);
CLATTN_API cl_command_queue clattn_env_queue(const clattn_env *env);
CLATTN_API cl_device_id clattn_env_device(const clattn_env *env);
CLATTN_API const clattn_device_desc *clattn_env_device_desc(const clattn_env *env);

/* What clattn relies on about `device`, as one line of space-separated name=value fields, in
 * this order: opencl (the OpenCL version), opencl_c, local_memory and max_work_group (bytes and
 * work-items, as clattn plans with them: under CLATTN_MAX_LOCAL_MEMORY and
 * CLATTN_MAX_WORK_GROUP), compute_units, cache (bytes of global memory cache, 0 where the
 * driver reports none: causal attention sizes its groups' order by it), fp16, fp64 and
 * subgroups (yes or no: what the driver
 * reports, never inferred from a vendor name), vector_float and vector_half (the preferred
 * widths), extensions (the last field, its names separated by commas). Cut to `capacity`, always
 * terminated. Statuses: CLATTN_SUCCESS, CLATTN_ERR_INVALID_ARGUMENT, OpenCL's. */
CLATTN_API int clattn_device_facts(cl_device_id device, char *text, size_t capacity);

/* The matrix units (tensor cores, XMX, WMMA/MFMA) clattn can drive on the queue's device, as
 * CLATTN_MATRIX_* bits: each mechanism is built and run once per (context, device) on a known
 * 16 x 16 product and counts only when every element comes back exact; a device that is not
 * offered it is not probed (cl_nv_device_attribute_query with compute capability 8.0 or more
 * for NVIDIA's mma.sync; cl_amd_device_attribute_query and a device named for an architecture
 * that has the builtin, gfx11 for WMMA, gfx90a, gfx94 or gfx95 for MFMA;
 * cl_intel_subgroup_matrix_multiply_accumulate for Intel's dpas). Cached until
 * clattn_cache_clear(context) (mma-tf32's known product: 16 x 8 by 8 x 8). The probes run on a
 * queue of their own in the queue's context: nothing enqueued on `queue` delays them, and they
 * enqueue nothing there. 0 on CPUs, PoCL and Oclgrind. Statuses: CLATTN_SUCCESS,
 * CLATTN_ERR_INVALID_ARGUMENT, OpenCL's (a probe that does not build is not an error: that unit
 * is absent). f16 or bf16 inputs, f32 accumulators: */
#define CLATTN_MATRIX_MMA_F16   1u   /* NVIDIA mma.sync.m16n8k16 (sm_80 on), f16 */
#define CLATTN_MATRIX_MMA_BF16  2u   /* the same with bf16 */
#define CLATTN_MATRIX_WMMA_F16  4u   /* AMD v_wmma_f32_16x16x16 (RDNA3, waves of 32), f16 */
#define CLATTN_MATRIX_WMMA_BF16 8u   /* the same with bf16 */
#define CLATTN_MATRIX_MFMA_F16  16u  /* AMD v_mfma_f32_16x16x16 (CDNA2, CDNA3), f16 */
#define CLATTN_MATRIX_MFMA_BF16 32u  /* the same with bf16 */
#define CLATTN_MATRIX_DPAS_F16  64u  /* Intel dpas (Xe-HPG, Xe-HPC, Xe2: subgroups of 8 or 16) */
#define CLATTN_MATRIX_DPAS_BF16 128u /* the same with bf16 */
/* f32 inputs as three tf32 products each (3xTF32: about f32's accuracy), f32 accumulators: */
#define CLATTN_MATRIX_MMA_TF32 256u /* NVIDIA mma.sync.m16n8k8 .tf32 (sm_80 on) */
CLATTN_API int clattn_matrix_units(cl_command_queue queue, unsigned *units);
/* The name of one CLATTN_MATRIX_* bit, as the benchmark and `python -m clattn devices` print it
 * ("mma-f16", "wmma-bf16", "mfma-f16", "dpas-bf16", "mma-tf32", ...); NULL for anything but one
 * such bit. */
CLATTN_API const char *clattn_matrix_unit_name(unsigned unit);

/* Allocates a contiguous tensor of `dtype` and shape {d0,d1,d2,d3} (read-write buffer). Release
 * it with clattn_tensor_free. */
CLATTN_API int clattn_env_alloc(clattn_env *env, clattn_dtype dtype, const int64_t shape[4],
                                clattn_tensor *out);
/* Releases the tensor's buffer and clears the descriptor. NULL is allowed. */
CLATTN_API void clattn_tensor_free(clattn_tensor *t);
/* Blocking copies between host memory (dense, row-major, the tensor's dtype) and a contiguous
 * tensor, after everything enqueued on the env's queue before them (also on a wrapped
 * out-of-order queue). Statuses: CLATTN_ERR_INVALID_ARGUMENT (NULL pointers, strided tensor), the
 * validator's, OpenCL's. */
CLATTN_API int clattn_env_upload(clattn_env *env, const clattn_tensor *t, const void *host);
CLATTN_API int clattn_env_download(clattn_env *env, const clattn_tensor *t, void *host);

/* ---------------------------------------------------------------------------------------------
 * Program cache
 *
 * Programs are built lazily on first use and cached per (context, device, source hash, build
 * options). Cached programs keep their context alive; release them with clattn_cache_clear.
 * clattn_cache_export/clattn_cache_import carry compiled binaries to another process; setting
 * CLATTN_CACHE_DIR keeps them on disk (each miss looks there before it builds, and writes there
 * after).
 * ------------------------------------------------------------------------------------------- */

/* Drops every cached program of `context` (and its matrix-unit probe results, and the kernels
 * kept for the next calls). NULL drops every context's, and clears CLBlast's program cache too
 * (through which the composed attention path keeps contexts alive) and the tuning answers kept
 * per device; call it before exit under Oclgrind, whose teardown crashes on CLBlast's cache
 * otherwise. */
CLATTN_API void clattn_cache_clear(cl_context context);
/* Number of programs in the cache, and how many builds and hits it has served since start (for
 * tests and diagnostics). Any pointer may be NULL. */
CLATTN_API void clattn_cache_stats(size_t *programs, size_t *builds, size_t *hits);

/* Writes the programs cached for (context, device) to `data` as compiled binaries, so that
 * another process on the same device and driver can skip the builds (clattn_cache_import).
 * Each entry carries its op file, build options, a hash of the full source text it was built
 * from, the device's identity (platform name, device name, driver version, device version), the
 * driver's binary (CL_PROGRAM_BINARIES) and a checksum; the format is in
 * src/runtime/program_binary.c. A program the driver gives no binary for is left out. *size is set
 * to the bytes needed (data == NULL: only that) or, on success, written; an empty cache writes 0
 * bytes. Statuses: CLATTN_SUCCESS, CLATTN_ERR_INVALID_ARGUMENT (NULL context, device or size),
 * CLATTN_ERR_BUFFER_TOO_SMALL (capacity below *size; nothing written),
 * CLATTN_ERR_OUT_OF_HOST_MEMORY, OpenCL's (querying the device). */
CLATTN_API int clattn_cache_export(cl_context context, cl_device_id device, void *data,
                                   size_t capacity, size_t *size);
/* Loads what clattn_cache_export wrote into the cache of (context, device): a later call that
 * needs one of these programs builds nothing (clattn_cache_stats' builds do not move). An entry
 * is skipped, and the program built from source when a call needs it, when it was built for
 * another device identity or driver version, from another source text (another clattn version,
 * or other CLATTN_KERNEL_DIR files), when it is truncated or corrupt (bad magic, lengths past the
 * end, wrong checksum), when the driver refuses its binary, or when that program is cached
 * already; each skip is a warning to the log callback. Any bytes are parsed safely: only an
 * intact entry (its checksum right) for this device and source text reaches the driver, which
 * is trusted with its binary as it is (PoCL 3.1 crashes on a binary that was altered and its
 * checksum made right again). *imported (may be NULL) is the number of programs added. Statuses:
 * CLATTN_SUCCESS (also when every entry was skipped), CLATTN_ERR_INVALID_ARGUMENT (NULL context,
 * device or data), OpenCL's (querying the device). */
CLATTN_API int clattn_cache_import(cl_context context, cl_device_id device, const void *data,
                                   size_t size, size_t *imported);

/* ---------------------------------------------------------------------------------------------
 * Multi-head reshape (cl/heads.cl, src/ops/heads.c)
 *
 * Every op here is a strided copy, bit-exact when source and destination dtypes match, rounding
 * to nearest-even when they narrow (f32 -> f16, f32 -> bf16). Because every attention op takes
 * strided views, the fast path of a model needs none of these copies; they exist for callers
 * that want contiguous tensors. Outputs must not overlap themselves or any input.
 *
 * Statuses common to all of them:
 *   CLATTN_ERR_NULL_TENSOR       a required tensor has no buffer
 *   CLATTN_ERR_INVALID_SHAPE     a dimension <= 0
 *   CLATTN_ERR_SHAPE_MISMATCH    shapes disagree (the message names both)
 *   CLATTN_ERR_INVALID_STRIDES   a negative stride, or an output whose view overlaps itself
 *   CLATTN_ERR_UNSUPPORTED_DTYPE a dtype other than f32/f16/bf16
 *   CLATTN_ERR_BUFFER_TOO_SMALL  a view reaches past CL_MEM_SIZE
 *   CLATTN_ERR_ALIASING          an output overlaps an input
 *   CLATTN_ERR_CONTEXT_MISMATCH  a buffer from another context than the queue
 *   CLATTN_ERR_INVALID_ARGUMENT  NULL tensor pointer, num_heads <= 0
 *   CL_INVALID_EVENT_WAIT_LIST   num_wait and wait_list disagree, or a NULL event in it
 *   CL_INVALID_COMMAND_QUEUE     a NULL queue
 *   CLATTN_ERR_BUILD_FAILED, CLATTN_ERR_KERNEL_SOURCE, OpenCL's
 * ------------------------------------------------------------------------------------------- */

/* dst[i,j,k,l] = convert(src[i,j,k,l] (+ bias[i,j,k,l])) over dst's shape.
 * src and bias may broadcast (stride 0); bias may be NULL. Any 4-D permutation is a permuted
 * view of src (clattn_tensor_permute). With a bias the sum is rounded once, in f32. */
CLATTN_API int clattn_copy(const clattn_tensor *src, const clattn_tensor *bias,
                           const clattn_tensor *dst, cl_command_queue queue, cl_uint num_wait,
                           const cl_event *wait_list, cl_event *event);

/* Split heads: x [B,S,H*D] (shape {1,B,S,H*D}) -> out [B,H,S,D], H = num_heads.
 * out[b,h,s,d] = x[b,s,h*D+d]. */
CLATTN_API int clattn_split_heads(const clattn_tensor *x, int num_heads, const clattn_tensor *out,
                                  cl_command_queue queue, cl_uint num_wait,
                                  const cl_event *wait_list, cl_event *event);

/* Merge heads: x [B,H,S,D] -> out [B,S,H*D] (shape {1,B,S,H*D}); the inverse of split heads. */
CLATTN_API int clattn_merge_heads(const clattn_tensor *x, const clattn_tensor *out,
                                  cl_command_queue queue, cl_uint num_wait,
                                  const cl_event *wait_list, cl_event *event);

/* Packed QKV: x [B,S,3*H*D] (shape {1,B,S,3*H*D}, q then k then v along the last axis, each H*D
 * wide, the layout of a fused in-projection) -> q, k, v, each [B,H,S,D].
 * q[b,h,s,d] = x[b,s,0*H*D + h*D + d] + bias[0*H*D + h*D + d], likewise k (1) and v (2).
 * bias may be NULL; else its shape is {1,1,1,3*H*D}. One kernel when q, k and v share a dtype
 * and layout (their offsets may differ); otherwise three copies, whose returned event completes
 * when all three have. */
CLATTN_API int clattn_split_qkv(const clattn_tensor *x, const clattn_tensor *bias, int num_heads,
                                const clattn_tensor *q, const clattn_tensor *k,
                                const clattn_tensor *v, cl_command_queue queue, cl_uint num_wait,
                                const cl_event *wait_list, cl_event *event);

/* ---------------------------------------------------------------------------------------------
 * The attention mask (cl/mask.cl, src/ops/mask.c), shared by softmax, attention and linear
 * attention
 *
 * For query i and key j of batch b, head h, with off = 0 (CLATTN_ALIGN_TOP_LEFT) or
 * key_len[b] - query_len[b] (CLATTN_ALIGN_BOTTOM_RIGHT, a KV cache) and pos = i + off:
 *
 *   s = scale * x[b,h,i,j]                          (attention: x = q_i . k_j)
 *   if softcap > 0:   s = softcap * tanh(s / softcap)
 *   s += bias[b,h,i,j]                               (optional additive tensor)
 *   s -= alibi_slopes[h] * |pos - j|                 (optional)
 *   visible(i,j) = j < key_len[b] && i < query_len[b]         (each optional)
 *               && (!causal || j <= pos)
 *               && (window_ok || global_ok) && keep[b,h,i,j] != 0
 *     window_ok = !window || (pos - window_left <= j <= pos + window_right); a side of -1
 *                 is unbounded (below -1: CLATTN_ERR_INVALID_ARGUMENT)
 *     global_ok = global_stride > 0 && (j % global_stride == 0 || pos % global_stride == 0)
 *   p = softmax over the visible j; invisible j get exactly 0.
 *
 * True in `keep` means attend (PyTorch's scaled_dot_product_attention polarity). A row with no
 * visible key (or only -inf scores) gives 0, or NaN with empty_rows_nan, and log-sum-exp -inf.
 * Invisible positions never influence the result, whatever they hold (NaN, Inf, 1e30). A NaN or
 * +Inf visible score gives a row of NaN (its invisible entries stay 0).
 *
 * Tensors (NULL when unused), broadcast to the scores [B,H,Sq,Sk] PyTorch's way: a dim of size 1
 * repeats (its stride is ignored), stride 0 repeats too:
 *   key_lengths, query_lengths  i32, shape {1,1,1,B}; values are clamped to [0,Sk] / [0,Sq]
 *                               first, and off uses the clamped values
 * The scores' dims are at most 2^30 each. "A -inf score" means the score after scale, softcap,
 * bias and ALiBi: with a softcap, x = -inf becomes the finite -softcap (a visible key), and
 * scale * x may be NaN (scale 0) or +inf (negative scale); mask with keep or lengths instead.
 *   keep                        u8, broadcastable to [B,H,Sq,Sk]
 *   bias                        f32/f16/bf16, broadcastable to [B,H,Sq,Sk]
 *   alibi_slopes                f32/f16/bf16, shape {1,1,1,H}
 * A zero-initialized clattn_mask is no mask at all.
 * ------------------------------------------------------------------------------------------- */
typedef enum clattn_align {
    CLATTN_ALIGN_TOP_LEFT = 0,    /* off = 0: query i sees keys 0..i (torch is_causal) */
    CLATTN_ALIGN_BOTTOM_RIGHT = 1 /* off = key_len - query_len: the last query sees every key */
} clattn_align;

typedef struct clattn_mask {
    int causal;         /* non-zero: j <= pos */
    clattn_align align; /* where pos is: see above; also used by the window and ALiBi */
    int window;         /* non-zero: the window below applies */
    int64_t window_left, window_right;
    int64_t global_stride; /* 0: no global positions */
    float softcap;         /* 0: none; > 0: s = softcap * tanh(s / softcap) */
    int empty_rows_nan;    /* non-zero: rows with no visible key give NaN instead of 0 */
    const clattn_tensor *key_lengths, *query_lengths;
    const clattn_tensor *keep;
    const clattn_tensor *bias;
    const clattn_tensor *alibi_slopes;
} clattn_mask;

/* ---------------------------------------------------------------------------------------------
 * Masked softmax (cl/softmax.cl, src/ops/softmax.c)
 * ------------------------------------------------------------------------------------------- */

/* y = softmax over the last axis of mask(scale * x), the mask as described above (NULL: none).
 *   x    [B,H,Sq,Sk]  f32/f16/bf16, any strides
 *   y    [B,H,Sq,Sk]  f32/f16/bf16; may be x itself (the identical view), else must not
 *                     overlap x
 *   lse  optional, {1,B,H,Sq} f32/f16/bf16: log(sum_j exp(s_j)) over the visible j; -inf for
 *        an empty row
 * Statuses: those of clattn_copy, plus CLATTN_ERR_INVALID_ARGUMENT for a mask value out of
 * range (window sides < -1, global_stride < 0, softcap < 0 or not finite, align unknown). */
CLATTN_API int clattn_softmax(const clattn_tensor *x, float scale, const clattn_mask *mask,
                              const clattn_tensor *y, const clattn_tensor *lse,
                              cl_command_queue queue, cl_uint num_wait, const cl_event *wait_list,
                              cl_event *event);

/* The gradient of y = softmax(z) over the last axis: dz = scale * y * (dy - sum_j dy_j * y_j).
 * Entries where y is 0 (masked, or underflowed) give exactly 0 and are left out of the sum, so
 * whatever dy holds there never reaches the result. With scale = the forward's scale and no
 * softcap, dz is the gradient with respect to x.
 *   y, dy, dz  [B,H,Sq,Sk] f32/f16/bf16; dz may be dy itself (the identical view).
 * Statuses: those of clattn_copy. */
CLATTN_API int clattn_softmax_backward(const clattn_tensor *y, const clattn_tensor *dy, float scale,
                                       const clattn_tensor *dz, cl_command_queue queue,
                                       cl_uint num_wait, const cl_event *wait_list,
                                       cl_event *event);

/* ---------------------------------------------------------------------------------------------
 * Fused scaled-dot-product attention (cl/attention.cl, src/ops/attention.c)
 * ------------------------------------------------------------------------------------------- */

/* out = softmax(mask(scale * q k^T)) v, never storing the Sq x Sk scores.
 *   q    [B,Hq,Sq,D]    k [B,Hkv,Sk,D]    v [B,Hkv,Sk,Dv]    out [B,Hq,Sq,Dv]
 *   Hq % Hkv == 0: query head h reads key/value head h / (Hq/Hkv) (MHA, GQA, MQA). Sq != Sk is
 *   cross-attention or a KV cache (use CLATTN_ALIGN_BOTTOM_RIGHT). D, Dv <= 256. Any strides:
 *   [B,S,H,D] storage and packed QKV buffers are permuted views, no copy.
 *   scale: 0 means 1/sqrt(D).
 *   mask: as for clattn_softmax (scores [B,Hq,Sq,Sk]); NULL for none.
 *   lse: optional {1,B,Hq,Sq}, log-sum-exp of the visible scores (-inf for an empty row).
 * A query with no visible key gets 0 (NaN with empty_rows_nan). f32/f16/bf16 storage, f32 math.
 * Statuses: those of clattn_softmax, plus CLATTN_ERR_DEVICE_LIMIT for head dims over 256. */
CLATTN_API int clattn_attention(const clattn_tensor *q, const clattn_tensor *k,
                                const clattn_tensor *v, float scale, const clattn_mask *mask,
                                const clattn_tensor *out, const clattn_tensor *lse,
                                cl_command_queue queue, cl_uint num_wait, const cl_event *wait_list,
                                cl_event *event);

/* Which computation clattn_attention_ex runs.
 *   CLATTN_PATH_AUTO      the fused kernel, unless the call asks for the attention weights
 *                         (only the composed path has them)
 *   CLATTN_PATH_FUSED     the fused kernel: O(Sq + Sk) memory, masked tiles skipped; a launch
 *                         with too few work-groups to fill the device (few queries against long
 *                         Sk, as in token-by-token decoding) splits the keys across work-groups
 *                         and merges the partial results by their log-sum-exp
 *   CLATTN_PATH_COMPOSED  CLBlast's strided-batched SGEMM for q k^T (heads as the batch),
 *                         clattn_softmax in place, SGEMM for p v: B*Hq*Sq*Sk floats of scratch
 *                         and the full quadratic work, masked or not. f16/bf16 inputs and
 *                         non-row-major views are first converted into f32 scratch. */
typedef enum clattn_attention_path {
    CLATTN_PATH_AUTO = 0,
    CLATTN_PATH_FUSED = 1,
    CLATTN_PATH_COMPOSED = 2,
} clattn_attention_path;

/* Options of clattn_attention_ex; all-zero means clattn_attention's behaviour. */
typedef struct clattn_attention_options {
    clattn_attention_path path;
    /* optional [B,Hq,Sq,Sk] output, any float dtype and strides: the attention probabilities
     * (0 where masked; a row with no visible key is 0, or NaN with empty_rows_nan), which users
     * plot as heat maps. Needs the composed path. */
    const clattn_tensor *weights;
    /* optional scratch of at least clattn_attention_workspace_size bytes, in the queue's
     * context, writable, and apart from every tensor of the call; NULL: the call allocates what
     * it needs and releases it when the work is done. Calls that share a workspace must not run
     * concurrently. */
    cl_mem workspace;
} clattn_attention_options;

/* clattn_attention with a choice of path, the attention weights and caller-owned scratch.
 * Statuses: those of clattn_attention, plus CLATTN_ERR_INVALID_ARGUMENT for weights with
 * CLATTN_PATH_FUSED, an unknown path or a read-only workspace, CLATTN_ERR_BUFFER_TOO_SMALL for
 * a workspace below the size it needs, CLATTN_ERR_ALIASING for a workspace that overlaps a
 * tensor of the call, CLATTN_ERR_BLAS for a CLBlast failure. The composed path enqueues several
 * steps: a runtime failure of a later one (OpenCL, CLBlast) leaves the earlier ones enqueued. */
CLATTN_API int clattn_attention_ex(const clattn_tensor *q, const clattn_tensor *k,
                                   const clattn_tensor *v, float scale, const clattn_mask *mask,
                                   const clattn_tensor *out, const clattn_tensor *lse,
                                   const clattn_attention_options *options, cl_command_queue queue,
                                   cl_uint num_wait, const cl_event *wait_list, cl_event *event);

/* The bytes of scratch the same clattn_attention_ex call would need (0: none), after the same
 * validation; `queue` names the device (the need can depend on it). */
CLATTN_API int clattn_attention_workspace_size(const clattn_tensor *q, const clattn_tensor *k,
                                               const clattn_tensor *v, const clattn_mask *mask,
                                               const clattn_tensor *out, const clattn_tensor *lse,
                                               const clattn_attention_options *options,
                                               cl_command_queue queue, size_t *bytes);

/* ---------------------------------------------------------------------------------------------
 * Attention backward (cl/attention_backward.cl, src/ops/attention_backward.c)
 * ------------------------------------------------------------------------------------------- */

/* Options of clattn_attention_backward; NULL means all-zero. */
typedef struct clattn_attention_backward_options {
    /* CLATTN_PATH_AUTO and CLATTN_PATH_FUSED: the fused kernels. CLATTN_PATH_COMPOSED: p
     * recomputed by GEMM and clattn_softmax, dS by clattn_softmax_backward, dq, dk, dv by GEMMs
     * (B*Hq*Sq*Sk floats of scratch three times over, the full quadratic work); it takes no
     * softcap and no dbias (CLATTN_ERR_INVALID_ARGUMENT), and like the forward's composed path
     * it multiplies every row: NaN or Inf in a row no query sees reaches dq, dk or dv. */
    clattn_attention_path path;
    /* optional output: the gradient of mask->bias, in the bias's own shape (the dims it
     * broadcasts over summed, as PyTorch's autograd sums them), any float dtype and strides.
     * The keep mask, the lengths, the window and the ALiBi slopes have no gradient. */
    const clattn_tensor *dbias;
    /* optional scratch of at least clattn_attention_backward_workspace_size bytes, as for
     * clattn_attention_options */
    cl_mem workspace;
} clattn_attention_backward_options;

/* The gradients of out = clattn_attention(q, k, v, scale, mask) given dout, the loss's gradient
 * in out: dq, dk, dv (and dbias), with the forward's q, k, v, out, scale and mask and the lse it
 * returned. The scores are recomputed tile by tile from q, k and lse, never stored.
 *   q, k, v, out  as the forward had them; dout [B,Hq,Sq,Dv]; any float dtype and strides
 *   lse           {1,B,Hq,Sq} f32: the forward's log-sum-exp
 *   dq, dk, dv    outputs in the shapes of q, k, v, any float dtype and strides; with GQA/MQA a
 *                 kv head's gradient sums over its query heads
 * A query row whose lse is -inf (it saw no key) or NaN adds nothing to any gradient and gets
 * dq 0; a key no query sees gets dk and dv 0. Invisible positions (masked, past the lengths)
 * never reach a gradient, whatever q, k, v, dout or the bias hold there. No atomics: two runs
 * give the same bits. Few queries against many keys split the keys, as the forward does, and
 * few keys against many queries split the query rows.
 * Scratch (fused): 8 bytes per query row, K and V as f32 tiles, and with split keys a partial
 * dq per split, with split rows a partial dk and dv per split; with a dbias broadcast over
 * batches or heads, f32 copies of it (one per batch and kv head it is broadcast over, and per
 * row split for a bias one row along the queries).
 * Statuses: those of clattn_attention_ex, plus CLATTN_ERR_INVALID_ARGUMENT for dbias without a
 * bias, CLATTN_ERR_SHAPE_MISMATCH for a gradient or lse of another shape, CLATTN_ERR_ALIASING
 * for an output that overlaps any other tensor of the call. */
CLATTN_API int
clattn_attention_backward(const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *v,
                          const clattn_tensor *out, const clattn_tensor *dout,
                          const clattn_tensor *lse, float scale, const clattn_mask *mask,
                          const clattn_tensor *dq, const clattn_tensor *dk, const clattn_tensor *dv,
                          const clattn_attention_backward_options *options, cl_command_queue queue,
                          cl_uint num_wait, const cl_event *wait_list, cl_event *event);

/* The bytes of scratch the same clattn_attention_backward call needs, after the same
 * validation. */
CLATTN_API int clattn_attention_backward_workspace_size(
    const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *v,
    const clattn_tensor *out, const clattn_tensor *dout, const clattn_tensor *lse,
    const clattn_mask *mask, const clattn_tensor *dq, const clattn_tensor *dk,
    const clattn_tensor *dv, const clattn_attention_backward_options *options,
    cl_command_queue queue, size_t *bytes);

/* ---------------------------------------------------------------------------------------------
 * Linear attention (cl/linear_attention.cl, src/ops/linear_attention.c)
 *
 * Katharopoulos et al. (2020), with a feature map phi applied to every row of q and k:
 *
 *   out[b,h,i] = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps)
 *   S_i = sum_j phi(k_j) v_j^T    [D,Dv]        z_i = sum_j phi(k_j)    [D]
 *
 * where the sums run over the keys j visible to query i (kv head h / (Hq/Hkv)):
 *   j < key_len[b] and i < query_len[b]   (each optional), and
 *   j <= i + off when causal              (off as for the softmax mask: 0 top-left, key_len -
 *                                          query_len bottom-right)
 * A query that sees no key gets 0. The work is O(Sq + Sk) per head and no Sq x Sk matrix is
 * formed: causal runs chunk-parallel (the state of whole chunks of keys, carried by running
 * sums, plus the masked product within a chunk), which is exact, not an approximation.
 * ------------------------------------------------------------------------------------------- */
typedef enum clattn_feature_map {
    CLATTN_FEATURE_ELU1 = 0,    /* elu(x) + 1: x + 1 above 0, exp(x) below (the default) */
    CLATTN_FEATURE_RELU = 1,    /* max(x, 0) */
    CLATTN_FEATURE_IDENTITY = 2 /* x (the denominator may then be 0 or negative: inf or NaN) */
} clattn_feature_map;

#define CLATTN_LINEAR_EPS 1e-6f

/* Options of the linear-attention calls. NULL stands for CLATTN_LINEAR_OPTIONS_DEFAULT. */
typedef struct clattn_linear_options {
    clattn_feature_map feature_map;
    float eps;        /* added to every denominator; finite and >= 0 */
    cl_mem workspace; /* optional scratch, as for clattn_attention_options; NULL: allocated */
} clattn_linear_options;

#define CLATTN_LINEAR_OPTIONS_DEFAULT                                                              \
    { CLATTN_FEATURE_ELU1, CLATTN_LINEAR_EPS, NULL }

/* Linear attention over whole sequences.
 *   q [B,Hq,Sq,D]   k [B,Hkv,Sk,D]   v [B,Hkv,Sk,Dv]   out [B,Hq,Sq,Dv]
 *   Hq % Hkv == 0; D, Dv <= 256; f32/f16/bf16 storage, f32 math; any strides.
 *   mask: NULL, or a clattn_mask using only causal, align, key_lengths and query_lengths (keys
 *   past a length are left out of S and z, whatever they hold); the other fields must be zero.
 * Scratch: B*Hkv*(ceil(Sk/chunk)+1)*(D*Dv+D) floats, plus B*Hkv*Sk*D floats of phi(k) (the
 * chunk is 64 keys causal, larger when not); clattn_linear_attention_workspace_size says how
 * much exactly.
 * Statuses: those of clattn_attention_ex, with CLATTN_ERR_INVALID_ARGUMENT also for a mask
 * field linear attention has no meaning for, an unknown feature map or an eps that is negative
 * or not finite. */
CLATTN_API int clattn_linear_attention(const clattn_tensor *q, const clattn_tensor *k,
                                       const clattn_tensor *v, const clattn_mask *mask,
                                       const clattn_tensor *out,
                                       const clattn_linear_options *options, cl_command_queue queue,
                                       cl_uint num_wait, const cl_event *wait_list,
                                       cl_event *event);

/* The bytes of scratch the same clattn_linear_attention call needs, after the same validation.
 * A clattn_linear_attention_step needs what the causal call on the same q, k, v needs. */
CLATTN_API int clattn_linear_attention_workspace_size(
    const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *v, const clattn_mask *mask,
    const clattn_tensor *out, const clattn_linear_options *options, cl_command_queue queue,
    size_t *bytes);

/* The recurrent form, for token-by-token decoding: consumes n new tokens, outputs their rows,
 * and adds them to the caller-owned running state (S, z), which starts at zero.
 *   q [B,Hq,n,D]   k [B,Hkv,n,D]   v [B,Hkv,n,Dv]   out [B,Hq,n,Dv]
 *   state [B,Hkv,D,Dv] f32 and z {1,B,Hkv,D} f32: read, then overwritten with the sums over
 *   every token consumed so far. Token t sees the state plus the new tokens 0..t, so a run of
 *   steps over a sequence equals the causal clattn_linear_attention over it.
 *   lengths: NULL, or i32 {1,1,1,B}: batch b has lengths[b] (clamped to [0,n]) valid new
 *   tokens; the others neither enter the state nor get output (their rows are 0).
 * state and z must not overlap each other or any other tensor of the call.
 * Statuses: those of clattn_linear_attention. A step of at most the tuning table's RECURRENT
 * tokens (8 by default) is one kernel on the state itself and needs no scratch; a longer one is
 * up to four kernels, all built and set before the first is enqueued: a runtime failure to
 * enqueue a later one (an OpenCL error such as CL_OUT_OF_RESOURCES) leaves the earlier ones
 * enqueued, and then the state may already hold the new tokens. */
CLATTN_API int clattn_linear_attention_step(const clattn_tensor *q, const clattn_tensor *k,
                                            const clattn_tensor *v, const clattn_tensor *lengths,
                                            const clattn_tensor *state, const clattn_tensor *z,
                                            const clattn_tensor *out,
                                            const clattn_linear_options *options,
                                            cl_command_queue queue, cl_uint num_wait,
                                            const cl_event *wait_list, cl_event *event);

/* The gradients of out = clattn_linear_attention(q, k, v, mask, options) given dout, the loss's
 * gradient in out: dq, dk, dv in the shapes of q, k, v (any float dtype and strides), with the
 * forward's mask (causal, align, lengths) and options (feature map, eps; the workspace is this
 * call's). The forward's output is recomputed, not taken. With S_i, z_i the sums over query i's
 * visible keys, den_i = phi(q_i).z_i + eps, dnum_i = dout_i / den_i and dden_i = -(dout_i .
 * out_i) / den_i:
 *   dq_i = phi'(q_i) o (S_i dnum_i + z_i dden_i)
 *   dk_j = phi'(k_j) o sum_i (dnum_i . v_j + dden_i) phi(q_i),  dv_j = sum_i (phi(q_i).phi(k_j))
 * dnum_i over the queries i that see key j: the causal form sums them from the end in chunks (the
 * forward's scan in reverse), O(S) time and memory. phi' is elu1: 1 above 0, exp below; relu: 1
 * above 0, else 0; identity: 1. A query that sees no key gets dq 0 and adds nothing; a key no
 * query sees gets dk, dv 0. GQA: a kv head's gradients sum over its query heads. Nine kernels
 * a call, all built before the first is enqueued. Statuses: those of clattn_linear_attention. */
CLATTN_API int clattn_linear_attention_backward(const clattn_tensor *q, const clattn_tensor *k,
                                                const clattn_tensor *v, const clattn_tensor *dout,
                                                const clattn_mask *mask, const clattn_tensor *dq,
                                                const clattn_tensor *dk, const clattn_tensor *dv,
                                                const clattn_linear_options *options,
                                                cl_command_queue queue, cl_uint num_wait,
                                                const cl_event *wait_list, cl_event *event);

/* The bytes of scratch the same clattn_linear_attention_backward call needs, after the same
 * validation. */
CLATTN_API int clattn_linear_attention_backward_workspace_size(
    const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *v,
    const clattn_tensor *dout, const clattn_mask *mask, const clattn_tensor *dq,
    const clattn_tensor *dk, const clattn_tensor *dv, const clattn_linear_options *options,
    cl_command_queue queue, size_t *bytes);

/* ---------------------------------------------------------------------------------------------
 * Multi-head attention forward (src/ops/mha.c, cl/mha.cl)
 *
 * torch.nn.MultiheadAttention(batch_first=True) in eval mode (no dropout), E = embed_dim,
 * H = num_heads, D = E / H:
 *
 *   q = query Wq^T + bq     k = key Wk^T + bk     v = value Wv^T + bv
 *   head h of each: columns h*D .. h*D+D-1 (a strided view; the heads are never copied apart)
 *   o_h = softmax(mask(q_h k_h^T / sqrt(D))) v_h        (clattn_attention, f32 math)
 *   out = concat_h(o_h) Wo^T + bo
 *
 * The four projections are CLBlast SGEMMs (the gemm row of the tuning table tunes them), the
 * biases are added by starting each GEMM's output from the broadcast bias; the attention is the
 * fused kernel, or the composed path when the weights are asked for.
 *
 * Tensors (numpy-style shapes, right-aligned into the 4 dims; any strides; f32/f16/bf16 storage
 * unless said otherwise):
 *   query {1,B,Sq,E}   key {1,B,Sk,kdim}   value {1,B,Sk,vdim}   out {1,B,Sq,E}
 *   Self-attention passes the same view three times: its three projections are then one GEMM.
 *   in_proj_weight {1,1,3E,E} (rows of Wq, then Wk, then Wv) when kdim = vdim = E, or else
 *   q_proj_weight {1,1,E,E}, k_proj_weight {1,1,E,kdim}, v_proj_weight {1,1,E,vdim};
 *   in_proj_bias {1,1,1,3E} or NULL; out_proj_weight {1,1,E,E}; out_proj_bias {1,1,1,E} or NULL.
 * Masks (clattn_mha_options), combined as torch combines them:
 *   key_padding_mask {1,1,B,Sk}: u8, non-zero = attend, or float, added to the scores
 *   attn_mask broadcastable to [B,H,Sq,Sk] (torch's [Sq,Sk] is {1,1,Sq,Sk}; its [B*H,Sq,Sk] is
 *     the same memory as {B,H,Sq,Sk}): u8, non-zero = attend, or float, added to the scores
 *   is_causal: key j is hidden from query i when j > i (added to the masks above)
 * The u8 polarity is clattn's (True attends, as in scaled_dot_product_attention); torch's
 * nn.MultiheadAttention takes the inverse (True hides), which the Python binding's mha inverts.
 * A query row that sees no key gets attention output 0, so its out row is out_proj_bias (torch
 * 1.13 gives NaN there).
 * weights (optional output, need_weights): the attention probabilities, {1,B,Sq,Sk} averaged
 * over the heads (average_attn_weights) or {B,H,Sq,Sk} per head.
 * Not supported (torch's rarer options): dropout, add_bias_kv, add_zero_attn, unbatched input.
 * ------------------------------------------------------------------------------------------- */

/* The module's parameters. Exactly one of in_proj_weight and the three separate weights. */
typedef struct clattn_mha_params {
    int num_heads;
    const clattn_tensor *in_proj_weight;
    const clattn_tensor *q_proj_weight, *k_proj_weight, *v_proj_weight;
    const clattn_tensor *in_proj_bias;
    const clattn_tensor *out_proj_weight;
    const clattn_tensor *out_proj_bias;
} clattn_mha_params;

/* The forward call's options; all-zero is no mask, no weights, allocated scratch. */
typedef struct clattn_mha_options {
    const clattn_tensor *key_padding_mask;
    const clattn_tensor *attn_mask;
    int is_causal;
    const clattn_tensor *weights; /* NULL: need_weights=False */
    int average_attn_weights;     /* non-zero: weights is {1,B,Sq,Sk}, else {B,H,Sq,Sk} */
    /* optional scratch of at least clattn_mha_workspace_size bytes, as for
     * clattn_attention_options (NULL: allocated and released by the call) */
    cl_mem workspace;
} clattn_mha_options;

/* The forward pass above. Scratch: the projected q, k, v and the attention output (f32,
 * B*(2*Sq + 2*Sk)*E floats), plus f32 images of inputs and weights that CLBlast cannot read as
 * they are (not f32, or rows not contiguous), plus the attention's own (B*H*Sq*Sk floats when
 * the weights are asked for), plus a merged [B,*,Sq,Sk] mask when both masks are u8 or both
 * float. clattn_mha_workspace_size says how much exactly.
 * Statuses: those of clattn_attention_ex, plus CLATTN_ERR_INVALID_ARGUMENT for NULL params,
 * num_heads <= 0 or not dividing E, both or neither weight form; CLATTN_ERR_SHAPE_MISMATCH for
 * a tensor whose shape disagrees with the others; CLATTN_ERR_UNSUPPORTED_DTYPE for a mask that
 * is neither u8 nor float. Everything is checked before the first of its several enqueues; a
 * runtime failure of a later one (OpenCL, CLBlast) leaves the earlier ones enqueued. */
CLATTN_API int clattn_mha_forward(const clattn_tensor *query, const clattn_tensor *key,
                                  const clattn_tensor *value, const clattn_mha_params *params,
                                  const clattn_tensor *out, const clattn_mha_options *options,
                                  cl_command_queue queue, cl_uint num_wait,
                                  const cl_event *wait_list, cl_event *event);

/* The bytes of scratch the same clattn_mha_forward call needs, after the same validation. */
CLATTN_API int clattn_mha_workspace_size(const clattn_tensor *query, const clattn_tensor *key,
                                         const clattn_tensor *value,
                                         const clattn_mha_params *params, const clattn_tensor *out,
                                         const clattn_mha_options *options, cl_command_queue queue,
                                         size_t *bytes);

/* ---------------------------------------------------------------------------------------------
 * Tuning (src/runtime/tuning.c; parameters in src/runtime/tuning_params.h, rows in
 * src/runtime/tuning_table.def)
 *
 * Launch parameters (work-group sizes, vector widths, tiles, variants) come from a table of
 * rows looked up per op, storage dtype and device: the exact device name, then its vendor and
 * type, then its type, then the default row, which fits every device and is tuned for PoCL. A
 * row that does not fit the device (work-group or local-memory limits) is skipped with a
 * warning (the log callback). Overrides apply on top, the API's after the environment's:
 *   CLATTN_TUNE="softmax:GROUP=32,VEC=8;linear_attention:CHUNK=32"
 * The ops are copy, softmax, attention, linear_attention and gemm (CLBlast's Xgemm kernel, for
 * the composed path and MHA; no default row: without one CLBlast keeps its own parameters).
 * Each op's parameters, their defaults, ranges and meaning are one table,
 * src/runtime/tuning_params.h; clattn_tuning_lookup lists them with the values a device runs.
 * A malformed CLATTN_TUNE, or overrides that do not fit the device, make every call of that op
 * fail with CLATTN_ERR_INVALID_TUNING and the reason in clattn_last_error().
 * ------------------------------------------------------------------------------------------- */

/* Sets the override of `op` ("copy", "softmax", "attention", "linear_attention", "gemm") to
 * `params`, "NAME=VALUE,..." (less than CLATTN_TUNING_PARAMS_MAX characters: below); NULL or ""
 * removes it. Applies to every later call in the
 * process. Statuses: CLATTN_SUCCESS, CLATTN_ERR_INVALID_ARGUMENT (unknown op),
 * CLATTN_ERR_INVALID_TUNING (unknown parameter, not an integer, out of its range; the old
 * override stays). */
CLATTN_API int clattn_tuning_override(const char *op, const char *params);

/* The bytes of `params` that always hold clattn_tuning_lookup's answer, for any op and values
 * (the attention op's 25 parameters take about 270 today); an override is shorter too. */
#define CLATTN_TUNING_PARAMS_MAX 1024

/* The parameters `op` runs with on `device` for storage `dtype`, as "NAME=VALUE,..." in
 * `params` (table row and overrides; CLATTN_TUNING_PARAMS_MAX bytes always suffice).
 * Statuses: CLATTN_SUCCESS, CLATTN_ERR_INVALID_ARGUMENT (among others, a `capacity` too small
 * for the answer), CLATTN_ERR_INVALID_TUNING. */
CLATTN_API int clattn_tuning_lookup(cl_device_id device, const char *op, clattn_dtype dtype,
                                    char *params, size_t capacity);

/* The largest scratch buffer the library allocated for itself (a call without a workspace)
 * since the last reset; `reset` starts a new count after reading. For memory budgets and the
 * benchmark's "peak scratch" column. */
CLATTN_API size_t clattn_scratch_peak_bytes(int reset);

#ifdef __cplusplus
}
#endif
#endif /* CLATTN_H */
