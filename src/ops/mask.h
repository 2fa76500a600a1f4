/* The host side of the shared attention mask (cl/mask.cl). */
#ifndef CLATTN_MASK_H
#define CLATTN_MASK_H

#include "runtime/runtime.h"

/* A validated mask: its tensors broadcast to the scores' shape, its scalars as the kernel takes
 * them (window sides -1 when unbounded, global_stride 0 when it cannot matter). */
typedef struct clattn__mask_plan {
    bool has_key_lengths, has_query_lengths, has_keep, has_bias, has_alibi;
    clattn_tensor key_lengths, query_lengths, keep, bias, alibi_slopes;
    int causal, align_bottom, win_left, win_right, global_stride, empty_rows_nan;
    float softcap;
} clattn__mask_plan;

/* Validates `mask` (NULL: no mask) for scores of shape `scores` [B,H,Sq,Sk] on `context`. */
int clattn__mask_prepare(const clattn_mask *mask, const int64_t scores[4], cl_context context,
                         clattn__mask_plan *plan);
/* An output must not overlap any of the mask's tensors. */
int clattn__mask_check_output(const clattn__mask_plan *plan, const char *name,
                              const clattn_tensor *out);
/* The optional log-sum-exp output of an op over scores [B,H,Sq,Sk]: a valid output of shape
 * {1,B,H,Sq} that overlaps none of the op's `count` tensors nor the mask's. */
int clattn__mask_check_lse(const clattn__mask_plan *plan, const clattn_tensor *lse,
                           const int64_t scores[4], const char *const *names,
                           const clattn_tensor *const *views, int count, cl_context context);
/* Some mask tensor needs 64-bit indices (see clattn__narrow_index_limit). */
bool clattn__mask_needs_wide_index(const clattn__mask_plan *plan);
/* Appends the mask's -D options to the NUL-terminated `out`. */
void clattn__mask_options(const clattn__mask_plan *plan, char *out, size_t capacity);
/* Sets MASK_PARAMS from argument *arg on; advances *arg past them. */
int clattn__mask_set_args(cl_kernel kernel, cl_uint *arg, const clattn__mask_plan *plan,
                          float scale, bool wide);

#endif
