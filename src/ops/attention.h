/* Attention as other ops run it (MHA), and what src/ops/attention.c (validation, the fused
 * kernels) shares with src/ops/attention_composed.c (the CLBlast path). Not installed.
 *
 * A call is three steps: check (every argument; the mask packed), plan (the path's launch and
 * its scratch bytes, from shapes, strides, dtypes and the device alone), enqueue (no checks).
 * clattn_attention_ex runs all three; MHA plans first, from views whose buffers do not exist
 * yet (they live in its own scratch, which the plan sizes), then checks and enqueues with that
 * one plan. */
#ifndef CLATTN_ATTENTION_H
#define CLATTN_ATTENTION_H

#include "mask.h"
#include "runtime/launch.h"
#include "runtime/matrix_units.h"

/* One clattn_attention_ex call. */
typedef struct clattn__attention_args {
    const clattn_tensor *q, *k, *v, *out, *lse, *weights;
    const clattn_mask *mask_desc; /* the caller's */
    float scale;                  /* after the check: never 0 */
    clattn__mask_plan mask;       /* after the check */
} clattn__attention_args;

/* The fused kernel's launch: the tuning table's row, with LANES narrowed to divide the head
 * dims, TK halved to fit the local memory and GROUP the keys variant's own where it runs. */
typedef struct clattn__attention_launch {
    clattn__attention_tuning t;
    int variant;       /* CLATTN__ATTENTION_BLOCKS, _TILES, _KEYS, _LANES, _MICRO, _MMA or _UNITS */
    int splits, chunk; /* the key axis in `splits` chunks of `chunk` keys (1: unsplit) */
    int rows;          /* micro: work-item rows a group (its local arrays' size) */
    bool on_unit;      /* mma, units: on the matrix-unit instruction (else its emulation) */
    clattn__tile tile; /* units: the subgroup tile's mechanism (cl/mma.cl's MMA_UNIT, MMA_SG) */
    bool ahead;        /* mma: the next key tile fetched into registers during this one */
    bool async;        /* mma: key tiles double-buffered, the next copied during this one */
    int warps;         /* mma, units: subgroups a group (4; mma: 2 where 4 do not fit) */
    int order;         /* tiles, micro, mma, units: the groups' order (cl/mask.cl's
                          unit_place: 0 in turn, n longest first n heads at a time) */
} clattn__attention_launch;

/* What a call runs, decided once. */
typedef struct clattn__attention_schedule {
    int path;                        /* CLATTN_PATH_FUSED or CLATTN_PATH_COMPOSED */
    clattn__attention_launch launch; /* the fused path's */
    clattn__softmax_tuning softmax;  /* the composed path's softmax */
    size_t bytes;                    /* scratch */
} clattn__attention_schedule;

/* Every check clattn_attention_ex makes: fills a->mask and a->scale, and *path from the
 * options. */
int clattn__attention_check(clattn__attention_args *a, const clattn_attention_options *options,
                            cl_context context, int *path);
/* The plan of a call that takes `path` on the call's device (16-bit prefill may probe its
 * matrix units on the call's queue, once); the buffers of a's views may be NULL. */
int clattn__attention_plan(const clattn__attention_args *a, int path, const clattn__call *call,
                           clattn__attention_schedule *plan);
/* The groups' order (cl/mask.cl's unit_place) of a launch of `blocks` query blocks of each
 * (batch, query head) of q, whose keys and values are k and v: under a causal mask with the row's
 * LPT, longest first, as many heads a section as the cache (LPT_MB, else the device's; all heads
 * where it says none) holds the keys and values of (the query heads of a key head share its keys),
 * and at least enough for LPT_GROUPS_A_UNIT groups a compute unit (a section that starts in less
 * than a wave would end the launch on its heaviest blocks); else 0, a head's blocks in turn. A
 * hooked order (CLATTN__HOOK_ATTENTION_ORDER) is kept, up to the heads. */
int clattn__attention_order(const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *v,
                            bool causal, const clattn__attention_tuning *t, int64_t blocks,
                            cl_device_id device);

/* Enqueues a checked call with its plan; `workspace` holds plan->bytes (NULL when 0). */
int clattn__attention_enqueue(const clattn__attention_args *a,
                              const clattn__attention_schedule *plan, const clattn__call *call,
                              cl_mem workspace);

/* The scratch bytes the composed path needs for `a` (0: none). */
size_t clattn__attention_composed_workspace(const clattn__attention_args *a);

/* Enqueues the composed path: CLBlast GEMMs around the softmax (with `softmax`, its plan).
 * `workspace` holds at least clattn__attention_composed_workspace(a) bytes (NULL when that is
 * 0). */
int clattn__attention_composed(const clattn__attention_args *a,
                               const clattn__softmax_tuning *softmax, const clattn__call *call,
                               cl_mem workspace);

/* The gradients of a checked attention call (a: q, k, v, the mask and scale; a->out, a->lse and
 * a->weights unused) by the composed path: P recomputed by GEMM and softmax, dS by
 * clattn_softmax_backward, the products by GEMMs. No softcap, no dbias (the caller refuses
 * them). */
typedef struct clattn__attention_grads {
    const clattn__attention_args *a;
    const clattn_tensor *dout, *dq, *dk, *dv;
} clattn__attention_grads;

/* The fused backward's launch for clattn_attention_backward's arguments (tests): whether it
 * takes the tiles kernels, their group and slices a key or query, the queries pass's key splits
 * and its groups' order (clattn__attention_order), the keys pass's row splits and (lanes) key
 * tiles a work-item, and how it puts
 * dbias (may be NULL) together: cl/attention_backward.cl's DBIAS_MODE and the f32 replicas of
 * dbias it takes. Checks and plans as the call does; enqueues nothing. */
typedef struct clattn__backward_plan {
    bool tiled;
    int group, slices, splits, order, row_splits;
    int bias_mode, bias_replicas;
    int key_tiles; /* the lanes keys pass's tiles a work-item */
} clattn__backward_plan;
int clattn__attention_backward_plan(const clattn_tensor *q, const clattn_tensor *k,
                                    const clattn_tensor *v, const clattn_tensor *out,
                                    const clattn_tensor *dout, const clattn_tensor *lse,
                                    const clattn_mask *mask, const clattn_tensor *dq,
                                    const clattn_tensor *dk, const clattn_tensor *dv,
                                    const clattn_tensor *dbias, cl_command_queue queue,
                                    clattn__backward_plan *plan);

/* The scratch bytes the composed backward needs for `g`. */
size_t clattn__attention_composed_backward_workspace(const clattn__attention_grads *g);

/* Enqueues the composed backward; `workspace` holds at least the bytes above. */
int clattn__attention_composed_backward(const clattn__attention_grads *g,
                                        const clattn__softmax_tuning *softmax,
                                        const clattn__call *call, cl_mem workspace);

#endif
