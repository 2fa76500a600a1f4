/* Linear attention's forward as its backward (src/ops/linear_attention_backward.c) reuses it:
 * the call's arguments, its launch, and its first kernels (phi(k), the key-chunk states and
 * their running sums), which the backward runs first. Not installed. */
#ifndef CLATTN_LINEAR_ATTENTION_H
#define CLATTN_LINEAR_ATTENTION_H

#include "mask.h"

/* One validated call. */
typedef struct clattn__linear_args {
    const clattn_tensor *q, *k, *v, *out;
    const clattn_tensor *state, *z; /* the step's running state; NULL for whole sequences */
    bool step;
    const clattn_mask *mask_desc; /* the caller's (or the step's own) */
    clattn_feature_map feature_map;
    float eps;
    cl_mem workspace;
    clattn__mask_plan mask;
    /* the backward's call: its query and key kernels (BM rows a work-item) each accumulate a
     * row of both head dims, not the outputs' VALUE_DIM alone */
    bool gradients;
} clattn__linear_args;

/* The launch of a call: the table's row (LANES narrowed to divide the head dims; ROWS state
 * rows per linear_states work-item and BM queries per linear_outputs one resolved) and the
 * chunking. The causal chunk (the table's CHUNK) trades the quadratic work of the keys within
 * a chunk against the (Sk / chunk) states the scratch holds and the scan walks. */
typedef struct clattn__linear_launch {
    clattn__linear_attention_tuning t;
    int chunk, nchunks;
    bool causal;
    /* TILES: a group's block (state rows or queries, value columns), TILE_ROWS and TILE_COLS
     * resolved to divide it (TILE_COLS and TILE_STEP multiples of LANES) */
    int block_rows, block_cols, block_queries;
    /* the tiles' kernels map k as they stage it (MAP_KEYS: where a block of state rows is
     * whole lane vectors; else they read linear_features' phi(k), as the row kernels do) */
    bool map_keys;
    /* every row the tiles and the recurrent step load as lane vectors (q, k, v, the step's
     * state, the f32 scratch) starts on one, so they load them as aligned vectors (cl/rows.cl,
     * ALIGNED) */
    bool aligned;
    /* a step that runs linear_recurrence (RECURRENT), one kernel without scratch */
    bool recurrent;
} clattn__linear_launch;

/* The options' feature map and eps into `a` (NULL: the defaults), checked. */
int clattn__linear_check_options(const clattn_linear_options *o, clattn__linear_args *a);
/* Of the mask, linear attention takes only causal, align and the lengths. */
int clattn__linear_check_mask_fields(const clattn_mask *m);
/* The launch for a checked call (the tuning row, the chunks). */
int clattn__linear_pick_launch(cl_device_id device, const clattn__linear_args *a,
                               clattn__linear_launch *l);
/* CLATTN_ERR_DEVICE_LIMIT where a step's work-items reach 2^31 (the kernels number them with
 * int; the row kernels' counts too, which a tile kernel the compiler cannot run falls back to). */
int clattn__linear_check_launch_size(const clattn__linear_args *a, const clattn__linear_launch *l);
/* Floats of scratch: the key-chunk states, then phi(k) [B,Hkv,Sk,D] after them. */
size_t clattn__linear_state_floats(const clattn__linear_args *a, const clattn__linear_launch *l);
size_t clattn__linear_phik_floats(const clattn__linear_args *a);
/* The build options of the call's programs, NUL-terminated into `options`. */
void clattn__linear_options(const clattn__linear_args *a, const clattn__linear_launch *l, bool wide,
                            char *options, size_t size);
/* The first `count` of the forward's four steps (phi(k), the chunk states, their running sums,
 * the outputs), built from the program of `op_file` (linear_attention.cl, or a file built after
 * it) and given their arguments: the tiles' kernels where the launch takes them and the
 * compiler runs their groups, else the row kernels. phi(k)'s step only where a kernel taken
 * reads it, or `keep_phik` (the caller reads it after): else kernels[0] is NULL. items[i] is
 * each one's work-items, caps[i] its group cap (a tile kernel's group exactly). The caller
 * releases the kernels. */
int clattn__linear_prepare_steps(const clattn__linear_args *a, const clattn__linear_launch *l,
                                 const clattn__call *call, cl_mem scratch, bool wide,
                                 const char *op_file, const char *options, int count,
                                 bool keep_phik, cl_kernel *kernels, size_t *items, size_t *caps);

#endif
