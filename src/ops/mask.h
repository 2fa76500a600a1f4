/* The host side of the shared attention mask (cl/mask.cl). */
#ifndef CLATTN_MASK_H
#define CLATTN_MASK_H

#include "runtime/runtime.h"

/* The optional tensors of clattn_mask, in the order the kernels take them (MASK_PARAMS in
 * cl/mask.cl), one line each:
 *
 *   X(FIELD, SHAPE, DTYPES, HAS_MACRO, TYPE_MACRO, FIRST_STRIDE)
 *
 *   FIELD         the clattn_mask member, a const clattn_tensor * (NULL: absent)
 *   SHAPE         PER_BATCH {1,1,1,B}, PER_HEAD {1,1,1,H} (or {1,1,1,1}), or SCORES: broadcast
 *                 to the scores [B,H,Sq,Sk], PyTorch's way
 *   DTYPES        the dtypes it may have: a mask of 1 << clattn_dtype
 *   HAS_MACRO     the kernel's switch, built as -DHAS_MACRO=0 or 1
 *   TYPE_MACRO    the kernel macro naming its storage dtype, or FIXED when it has one dtype
 *   FIRST_STRIDE  the first of its strides the kernel takes (3: a vector passes its last)
 *
 * Packing (clattn__mask_prepare), validation, the call's tensor list (aliasing, workspaces),
 * the wide-index choice, the build options and the kernel arguments all walk this table. */
#define CLATTN__MASK_TENSORS(X)                                                                    \
    X(key_lengths, PER_BATCH, 1u << CLATTN_I32, HAS_KLEN, FIXED, 3)                                \
    X(query_lengths, PER_BATCH, 1u << CLATTN_I32, HAS_QLEN, FIXED, 3)                              \
    X(keep, SCORES, 1u << CLATTN_U8, HAS_KEEP, FIXED, 0)                                           \
    X(bias, SCORES, CLATTN__FLOAT_DTYPES, HAS_BIAS, BIAS_T, 0)                                     \
    X(alibi_slopes, PER_HEAD, CLATTN__FLOAT_DTYPES, HAS_ALIBI, ALIBI_T, 3)

#define CLATTN__MASK_INDEX(FIELD, SHAPE, DTYPES, HAS, TYPE, FIRST) CLATTN__MASK_##FIELD,
enum { CLATTN__MASK_TENSORS(CLATTN__MASK_INDEX) CLATTN__MASK_TENSOR_COUNT };
#undef CLATTN__MASK_INDEX

/* A validated mask: its tensors broadcast to the scores' shape (has[i] says which are given),
 * its scalars as the kernel takes them (window sides -1 when unbounded, global_stride 0 when it
 * cannot matter). */
typedef struct clattn__mask_plan {
    int causal, align_bottom, win_left, win_right, global_stride, empty_rows_nan;
    float softcap;
    bool has[CLATTN__MASK_TENSOR_COUNT];
    clattn_tensor tensors[CLATTN__MASK_TENSOR_COUNT]; /* indexed by CLATTN__MASK_<field> */
} clattn__mask_plan;

/* Validates `mask` (NULL: no mask) for scores of shape `scores` [B,H,Sq,Sk] on `context`. */
int clattn__mask_prepare(const clattn_mask *mask, const int64_t scores[4], cl_context context,
                         clattn__mask_plan *plan);
/* Adds the mask's tensors (those given) to a call's list (runtime/tensor.h). */
void clattn__mask_list_tensors(const clattn__mask_plan *plan, clattn__tensor_list *list);
/* An output must not overlap any of the mask's tensors. */
int clattn__mask_check_output(const clattn__mask_plan *plan, const char *name,
                              const clattn_tensor *out);
/* The optional log-sum-exp output of an op over scores [B,H,Sq,Sk]: a valid output of shape
 * {1,B,H,Sq} that overlaps none of the op's `inputs` nor the mask's tensors. */
int clattn__mask_check_lse(const clattn__mask_plan *plan, const clattn_tensor *lse,
                           const int64_t scores[4], const clattn__tensor_list *inputs,
                           cl_context context);
/* Some mask tensor needs 64-bit indices (see clattn__narrow_index_limit). */
bool clattn__mask_needs_wide_index(const clattn__mask_plan *plan);
/* Appends the mask's -D options to the NUL-terminated `out`. */
void clattn__mask_options(const clattn__mask_plan *plan, char *out, size_t capacity);
/* Sets MASK_PARAMS from argument *arg on; advances *arg past them. */
int clattn__mask_set_args(cl_kernel kernel, cl_uint *arg, const clattn__mask_plan *plan,
                          float scale, bool wide);

#endif
