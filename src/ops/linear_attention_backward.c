/*
 * The gradients of linear attention (cl/linear_attention_backward.cl): validation, and the
 * chain of nine kernels: the forward's first three (phi(k), the key-chunk states, their
 * running sums; src/ops/linear_attention.c), then the states' transposes, dq with each query's
 * terms, the query-chunk sums of those terms, their running sums from the end, their
 * transposes, and dk, dv.
 */
#include "linear_attention.h"

#include <stdio.h>
#include <string.h>

#define LINEAR_MAX_HEAD_DIM 256
#define TERM_FLOATS(D, Dv)  ((D) + (Dv) + 1) /* = TERM in the kernels */

typedef struct backward_args {
    clattn__linear_args f; /* the forward's view of the call: dout stands in its out */
    const clattn_tensor *dout, *dq, *dk, *dv;
} backward_args;

/* The forward's launch, and the chunks of queries the key side sums over. */
typedef struct backward_launch {
    clattn__linear_launch f;
    int qchunk, qchunks;
} backward_launch;

static void list_tensors(const backward_args *a, clattn__tensor_list *list) {
    *list = (clattn__tensor_list){0};
    const char *names[7] = {"q", "k", "v", "dout", "dq", "dk", "dv"};
    const clattn_tensor *views[7] = {a->f.q, a->f.k, a->f.v, a->dout, a->dq, a->dk, a->dv};
    for (int i = 0; i < 7; ++i) clattn__tensor_list_add(list, names[i], views[i]);
    clattn__mask_list_tensors(&a->f.mask, list);
}

static int check_inputs(backward_args *a, const clattn_linear_options *options,
                        cl_context context) {
    const char *names[4] = {"q", "k", "v", "dout"};
    const clattn_tensor *views[4] = {a->f.q, a->f.k, a->f.v, a->dout};
    int status = clattn__linear_check_options(options, &a->f);
    for (int i = 0; i < 4 && status == CLATTN_SUCCESS; ++i)
        status = clattn__check_tensor(names[i], views[i], context, CLATTN__FLOAT_DTYPES, false);
    if (status == CLATTN_SUCCESS)
        status =
            clattn__check_attention_shapes(a->f.q, a->f.k, a->f.v, a->dout, LINEAR_MAX_HEAD_DIM);
    if (status == CLATTN_SUCCESS) status = clattn__linear_check_mask_fields(a->f.mask_desc);
    const int64_t *q = a->f.q->shape;
    const int64_t scores[4] = {q[0], q[1], q[2], a->f.k->shape[2]};
    if (status == CLATTN_SUCCESS)
        status = clattn__mask_prepare(a->f.mask_desc, scores, context, &a->f.mask);
    return status;
}

/* dq, dk and dv in the shapes of q, k and v, each apart from every other tensor. */
static int check_outputs(const backward_args *a, cl_context context) {
    const char *names[3] = {"dq", "dk", "dv"};
    const clattn_tensor *outs[3] = {a->dq, a->dk, a->dv}, *ins[3] = {a->f.q, a->f.k, a->f.v};
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < 3 && status == CLATTN_SUCCESS; ++i) {
        status = clattn__check_tensor(names[i], outs[i], context, CLATTN__FLOAT_DTYPES, true);
        if (status == CLATTN_SUCCESS)
            status = clattn__check_same_shape(names[i], outs[i], names[i] + 1, ins[i]);
    }
    clattn__tensor_list all;
    list_tensors(a, &all);
    for (int i = 0; i < 3 && status == CLATTN_SUCCESS; ++i)
        status = clattn__check_apart(names[i], outs[i], &all);
    return status;
}

static size_t term_floats(const backward_args *a) {
    const int64_t *q = a->f.q->shape;
    return (size_t)(q[0] * q[1] * q[2]) * (size_t)TERM_FLOATS(q[3], a->f.v->shape[3]);
}

static size_t qstate_floats(const backward_args *a, const backward_launch *l) {
    const size_t slot = (size_t)(a->f.k->shape[3] * (a->f.v->shape[3] + 1));
    return (size_t)(a->f.k->shape[0] * a->f.k->shape[1]) * (size_t)(l->qchunks + 1) * slot;
}

/* The slots of each head's key or query states that the gradient kernels read: every one when
 * causal; else the key states' total and the query states' sum over every chunk. */
typedef struct read_slots {
    int per_head, first, count;
} read_slots;

static read_slots slots_read(const backward_launch *l, bool queries) {
    const int per_head = (queries ? l->qchunks : l->f.nchunks) + 1;
    return (read_slots){per_head, l->f.causal || queries ? 0 : per_head - 1,
                        l->f.causal ? per_head : 1};
}

/* S^T alone (= TSLOT in the kernels) for each slot of every (batch, kv head) that slots_read
 * names: the key states' transposes, or the query states'. */
static size_t transposed_floats(const backward_args *a, const backward_launch *l, bool queries) {
    const int64_t *k = a->f.k->shape;
    return (size_t)(k[0] * k[1]) * (size_t)slots_read(l, queries).count *
           (size_t)(k[3] * a->f.v->shape[3]);
}

/* Where each part of the scratch starts (floats): the forward's states and phi(k), the terms,
 * the query-chunk states, the key-chunk states transposed, the query-chunk states transposed;
 * and the whole. */
static size_t terms_at(const backward_args *a, const backward_launch *l) {
    return clattn__linear_state_floats(&a->f, &l->f) + clattn__linear_phik_floats(&a->f);
}
static size_t qstates_at(const backward_args *a, const backward_launch *l) {
    return terms_at(a, l) + term_floats(a);
}
static size_t states_t_at(const backward_args *a, const backward_launch *l) {
    return qstates_at(a, l) + qstate_floats(a, l);
}
static size_t qstates_t_at(const backward_args *a, const backward_launch *l) {
    return states_t_at(a, l) + transposed_floats(a, l, false);
}
static size_t scratch_floats(const backward_args *a, const backward_launch *l) {
    return qstates_t_at(a, l) + transposed_floats(a, l, true);
}

/* The query chunks: the forward's key chunk, at most Sq. */
static int plan_launch(cl_device_id device, const backward_args *a, backward_launch *l) {
    int status = clattn__linear_pick_launch(device, &a->f, &l->f);
    const int64_t Sq = a->f.q->shape[2];
    l->qchunk = (int)(l->f.chunk < Sq ? l->f.chunk : Sq);
    l->qchunks = (int)((Sq + l->qchunk - 1) / l->qchunk);
    return status;
}

#define BACKWARD_KERNELS 6

/* The work-items of the backward's kernels, in their order. */
static void backward_items(const backward_args *a, const backward_launch *l,
                           size_t items[BACKWARD_KERNELS]) {
    const int64_t B = a->f.k->shape[0], Hq = a->f.q->shape[1], Hkv = a->f.k->shape[1];
    const int64_t D = a->f.k->shape[3], Dv = a->f.v->shape[3], bm = l->f.t.BM;
    items[0] = (size_t)(B * Hkv * slots_read(l, false).count * Dv);
    items[1] = (size_t)(B * Hq * ((a->f.q->shape[2] + bm - 1) / bm));
    items[2] = (size_t)(B * Hkv * l->qchunks * (D / l->f.t.ROWS));
    items[3] = (size_t)(B * Hkv * D * (Dv / l->f.t.LANES));
    items[4] = (size_t)(B * Hkv * slots_read(l, true).count * Dv);
    items[5] = (size_t)(B * Hkv * ((a->f.k->shape[2] + bm - 1) / bm));
}

/* The backward's kernels, and the forward's steps it runs first. */
static int check_launch_size(const backward_args *a, const backward_launch *l) {
    size_t items[BACKWARD_KERNELS];
    backward_items(a, l, items);
    size_t most = 0;
    for (int i = 0; i < BACKWARD_KERNELS; ++i) most = items[i] > most ? items[i] : most;
    const int status = clattn__linear_check_launch_size(&a->f, &l->f);
    if (status != CLATTN_SUCCESS) return status;
    if (most > 0x7fffffff - 1024)
        return clattn__fail(CLATTN_ERR_DEVICE_LIMIT,
                            "the launch needs %zu work-items; at most 2^31 - 1", most);
    return CLATTN_SUCCESS;
}

static int plan_call(backward_args *a, const clattn_linear_options *options,
                     const clattn__call *call, backward_launch *l, size_t *bytes) {
    int status = check_inputs(a, options, call->context);
    if (status == CLATTN_SUCCESS) status = check_outputs(a, call->context);
    if (status == CLATTN_SUCCESS) status = plan_launch(call->device, a, l);
    if (status == CLATTN_SUCCESS) status = check_launch_size(a, l);
    if (status == CLATTN_SUCCESS) *bytes = scratch_floats(a, l) * 4;
    return status;
}

static bool needs_wide_index(const backward_args *a, const backward_launch *l) {
    const clattn_tensor *views[7] = {a->f.q, a->f.k, a->f.v, a->dout, a->dq, a->dk, a->dv};
    return clattn__needs_wide_index(views, 7) || clattn__mask_needs_wide_index(&a->f.mask) ||
           scratch_floats(a, l) >= (size_t)clattn__narrow_index_limit();
}

/* The scratch as a kernel argument at float offset `at` (0: the buffer alone). */
static int set_scratch(cl_kernel kernel, cl_uint *arg, cl_mem scratch, size_t at, bool offset,
                       bool wide) {
    int status = clattn__set_buffer_arg(kernel, (*arg)++, scratch);
    if (status == CLATTN_SUCCESS && offset)
        status = clattn__set_idx_arg(kernel, (*arg)++, at, wide);
    return status;
}

/* One backward kernel's arguments: its tensors, then what its parameter list takes. */
typedef struct backward_call {
    const backward_args *a;
    const backward_launch *l;
    cl_mem scratch;
    bool wide;
} backward_call;

static int set_views(const backward_call *c, cl_kernel kernel, cl_uint *arg,
                     const clattn_tensor *const *views, int count) {
    return clattn__set_views_args(kernel, arg, views, count, c->wide);
}

/* linear_transpose_states, from the states at `from` to `to` */
static int set_transpose_args(const backward_call *c, cl_kernel kernel, bool queries, size_t from,
                              size_t to) {
    const backward_args *a = c->a;
    const read_slots slots = slots_read(c->l, queries);
    cl_uint arg = 0;
    int status = set_scratch(kernel, &arg, c->scratch, from, true, c->wide);
    if (status == CLATTN_SUCCESS) status = set_scratch(kernel, &arg, c->scratch, to, true, c->wide);
    const int64_t ints[4] = {a->f.k->shape[0] * a->f.k->shape[1], slots.per_head, slots.first,
                             slots.count};
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, ints, 4);
    return status;
}

static int set_key_transpose_args(const backward_call *c, cl_kernel kernel) {
    return set_transpose_args(c, kernel, false, 0, states_t_at(c->a, c->l));
}

static int set_query_transpose_args(const backward_call *c, cl_kernel kernel) {
    return set_transpose_args(c, kernel, true, qstates_at(c->a, c->l), qstates_t_at(c->a, c->l));
}

static int set_query_grads_args(const backward_call *c, cl_kernel kernel) {
    const backward_args *a = c->a;
    const clattn_tensor *views[4] = {a->f.q, a->f.v, a->dout, a->dq};
    cl_uint arg = 0;
    int status = set_views(c, kernel, &arg, views, 4);
    const size_t phik = clattn__linear_state_floats(&a->f, &c->l->f);
    if (status == CLATTN_SUCCESS) status = set_scratch(kernel, &arg, c->scratch, 0, false, c->wide);
    if (status == CLATTN_SUCCESS)
        status = set_scratch(kernel, &arg, c->scratch, states_t_at(a, c->l), true, c->wide);
    if (status == CLATTN_SUCCESS)
        status = set_scratch(kernel, &arg, c->scratch, phik, true, c->wide);
    if (status == CLATTN_SUCCESS)
        status = set_scratch(kernel, &arg, c->scratch, terms_at(a, c->l), true, c->wide);
    const int64_t ints[7] = {a->f.q->shape[0], a->f.q->shape[1], a->f.k->shape[1], a->f.q->shape[2],
                             a->f.k->shape[2], c->l->f.chunk,    c->l->f.nchunks};
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, ints, 7);
    if (status == CLATTN_SUCCESS) status = clattn__set_float_arg(kernel, arg++, a->f.eps);
    if (status == CLATTN_SUCCESS)
        status = clattn__mask_set_args(kernel, &arg, &a->f.mask, 1.0f, c->wide);
    return status;
}

static int set_term_states_args(const backward_call *c, cl_kernel kernel) {
    const backward_args *a = c->a;
    cl_uint arg = 0;
    int status = set_scratch(kernel, &arg, c->scratch, terms_at(a, c->l), true, c->wide);
    if (status == CLATTN_SUCCESS)
        status = set_scratch(kernel, &arg, c->scratch, qstates_at(a, c->l), true, c->wide);
    const int64_t ints[6] = {a->f.q->shape[0], a->f.q->shape[1], a->f.k->shape[1],
                             a->f.q->shape[2], c->l->qchunk,     c->l->qchunks};
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, ints, 6);
    return status;
}

static int set_term_scan_args(const backward_call *c, cl_kernel kernel) {
    const backward_args *a = c->a;
    cl_uint arg = 0;
    int status = set_scratch(kernel, &arg, c->scratch, qstates_at(a, c->l), true, c->wide);
    const int64_t ints[2] = {a->f.k->shape[0] * a->f.k->shape[1], c->l->qchunks};
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, ints, 2);
    return status;
}

static int set_key_grads_args(const backward_call *c, cl_kernel kernel) {
    const backward_args *a = c->a;
    const clattn_tensor *views[4] = {a->f.k, a->f.v, a->dk, a->dv};
    cl_uint arg = 0;
    int status = set_views(c, kernel, &arg, views, 4);
    const size_t phik = clattn__linear_state_floats(&a->f, &c->l->f);
    if (status == CLATTN_SUCCESS)
        status = set_scratch(kernel, &arg, c->scratch, phik, true, c->wide);
    if (status == CLATTN_SUCCESS)
        status = set_scratch(kernel, &arg, c->scratch, terms_at(a, c->l), true, c->wide);
    if (status == CLATTN_SUCCESS)
        status = set_scratch(kernel, &arg, c->scratch, qstates_at(a, c->l), true, c->wide);
    if (status == CLATTN_SUCCESS)
        status = set_scratch(kernel, &arg, c->scratch, qstates_t_at(a, c->l), true, c->wide);
    const int64_t ints[7] = {a->f.q->shape[0], a->f.q->shape[1], a->f.k->shape[1], a->f.q->shape[2],
                             a->f.k->shape[2], c->l->qchunk,     c->l->qchunks};
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, ints, 7);
    if (status == CLATTN_SUCCESS)
        status = clattn__mask_set_args(kernel, &arg, &a->f.mask, 1.0f, c->wide);
    return status;
}

typedef int (*set_args_fn)(const backward_call *c, cl_kernel kernel);

/* The forward's three key-side kernels, then the backward's six: every one built and given
 * its arguments before the first is enqueued, so that a build failure enqueues nothing. */
static int enqueue_backward(const backward_args *a, const backward_launch *l,
                            const clattn__call *call, cl_mem scratch) {
    static const char *const names[BACKWARD_KERNELS] = {
        "linear_transpose_states", "linear_query_grads",      "linear_term_states",
        "linear_term_scan",        "linear_transpose_states", "linear_key_grads"};
    static const set_args_fn setters[BACKWARD_KERNELS] = {
        set_key_transpose_args, set_query_grads_args,     set_term_states_args,
        set_term_scan_args,     set_query_transpose_args, set_key_grads_args};
    const backward_call c = {a, l, scratch, needs_wide_index(a, l)};
    char options[1024], more[1280];
    clattn__linear_options(&a->f, &l->f, c.wide, options, sizeof options);
    snprintf(more, sizeof more, "%s -DDO_T=%s -DDQ_T=%s -DDK_T=%s -DDV_T=%s", options,
             clattn_dtype_name(a->dout->dtype), clattn_dtype_name(a->dq->dtype),
             clattn_dtype_name(a->dk->dtype), clattn_dtype_name(a->dv->dtype));
    enum { ALL = 3 + BACKWARD_KERNELS, TERM_SCAN = 3 + 3 };
    cl_kernel kernels[ALL] = {NULL};
    size_t items[ALL], caps[3];
    /* the forward's kernels from the backward's own program (built after the forward's file),
     * so that a call builds one program, not two */
    int status = clattn__linear_prepare_steps(&a->f, &l->f, call, scratch, c.wide,
                                              "linear_attention_backward.cl", more, 3, true,
                                              kernels, items, caps);
    backward_items(a, l, items + 3);
    for (int i = 0; i < BACKWARD_KERNELS && status == CLATTN_SUCCESS; ++i) {
        status = clattn__create_kernel(call->context, call->device, "linear_attention_backward.cl",
                                       more, names[i], &kernels[3 + i]);
        if (status == CLATTN_SUCCESS) status = setters[i](&c, kernels[3 + i]);
    }
    cl_event prev = NULL;
    for (int i = 0; i < ALL && status == CLATTN_SUCCESS; ++i) {
        const size_t group = i < 3 ? caps[i] : i == TERM_SCAN ? 64 : (size_t)l->f.t.GROUP;
        status = clattn__enqueue_items(call, kernels[i], items[i], group, &prev, i == ALL - 1);
    }
    if (prev) clReleaseEvent(prev);
    for (int i = 0; i < ALL; ++i) clattn__release_kernel(kernels[i]);
    return status;
}

static backward_args make_args(const clattn_tensor *q, const clattn_tensor *k,
                               const clattn_tensor *v, const clattn_tensor *dout,
                               const clattn_mask *mask, const clattn_tensor *dq,
                               const clattn_tensor *dk, const clattn_tensor *dv) {
    backward_args a;
    memset(&a, 0, sizeof a);
    a.f.q = q, a.f.k = k, a.f.v = v, a.f.out = dout, a.f.mask_desc = mask, a.f.gradients = true;
    a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv;
    return a;
}

int clattn_linear_attention_backward(const clattn_tensor *q, const clattn_tensor *k,
                                     const clattn_tensor *v, const clattn_tensor *dout,
                                     const clattn_mask *mask, const clattn_tensor *dq,
                                     const clattn_tensor *dk, const clattn_tensor *dv,
                                     const clattn_linear_options *options, cl_command_queue queue,
                                     cl_uint num_wait, const cl_event *wait_list, cl_event *event) {
    clattn__call call;
    backward_args a = make_args(q, k, v, dout, mask, dq, dk, dv);
    backward_launch l;
    size_t bytes = 0;
    int status = clattn__begin_call(&call, queue, num_wait, wait_list, event);
    if (status == CLATTN_SUCCESS) status = plan_call(&a, options, &call, &l, &bytes);
    cl_mem scratch = NULL;
    bool owned = false;
    if (status == CLATTN_SUCCESS) {
        clattn__tensor_list tensors;
        list_tensors(&a, &tensors);
        status =
            clattn__get_workspace(a.f.workspace, bytes, call.context, &tensors, &scratch, &owned);
    }
    if (status == CLATTN_SUCCESS) status = enqueue_backward(&a, &l, &call, scratch);
    if (owned && scratch) clReleaseMemObject(scratch);
    return status;
}

int clattn_linear_attention_backward_workspace_size(
    const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *v,
    const clattn_tensor *dout, const clattn_mask *mask, const clattn_tensor *dq,
    const clattn_tensor *dk, const clattn_tensor *dv, const clattn_linear_options *options,
    cl_command_queue queue, size_t *bytes) {
    clattn__call call;
    backward_args a = make_args(q, k, v, dout, mask, dq, dk, dv);
    backward_launch l;
    int status = clattn__begin_call(&call, queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS && !bytes)
        status = clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "bytes is NULL");
    if (status == CLATTN_SUCCESS) status = plan_call(&a, options, &call, &l, bytes);
    return status;
}
