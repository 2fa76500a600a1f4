/* The tensor-descriptor validator every op runs before its first enqueue. Not installed. */
#ifndef CLATTN_RUNTIME_TENSOR_H
#define CLATTN_RUNTIME_TENSOR_H

#include "status.h"

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
/* The tensors of one call, each with its name, for the checks that look at all of them: an
 * output apart from every input, a caller's workspace apart from every tensor. An op adds its
 * own, then its mask's (ops/mask.h); NULL tensors are not added. */
#define CLATTN__CALL_TENSORS_MAX 24
typedef struct clattn__tensor_list {
    int count;
    const char *names[CLATTN__CALL_TENSORS_MAX];
    const clattn_tensor *views[CLATTN__CALL_TENSORS_MAX];
} clattn__tensor_list;
void clattn__tensor_list_add(clattn__tensor_list *list, const char *name, const clattn_tensor *t);
/* `out` overlaps none of the list's tensors but its own entry (the one of the same address and
 * name): the same descriptor passed again under another name is refused. */
int clattn__check_apart(const char *out_name, const clattn_tensor *out,
                        const clattn__tensor_list *list);

/* Some of the views (NULL entries are skipped) reaches the narrow-index limit (hooks.h): the
 * call needs 64-bit IDX. */
bool clattn__needs_wide_index(const clattn_tensor *const *views, size_t count);

/* Every row of a and of b (their innermost dims, stride 1) starts a multiple of `vec` elements
 * from its buffer's base, and the device's buffer bases (CL_DEVICE_MEM_BASE_ADDR_ALIGN) keep
 * vectors of `vec` elements aligned: the condition of the kernels' ALIGNED vector accesses
 * (cl/common.cl). Dims of size 1 are free; vec < 2 is never aligned. */
bool clattn__rows_vector_aligned(const clattn_tensor *a, const clattn_tensor *b, int64_t vec,
                                 cl_device_id device);

#endif
