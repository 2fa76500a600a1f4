/* The program cache and kernel sources (src/runtime/program_cache.c, kernel.c, sources.c): hits,
 * keys, clearing, build failures with their logs, CLATTN_KERNEL_DIR, and four threads running ops
 * on their own queues over one context, every result checked. */
#include "harness.h"
#include "runtime/kernel.h"
#include "runtime/launch.h"
#include "runtime/program_cache.h"
#include "runtime/testing.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One small f32 -> dst_dtype copy on `queue`; returns its status. */
static int small_copy(test_ctx *t, cl_command_queue queue, clattn_dtype dst_dtype) {
    cl_int err;
    float zeros[64] = {0};
    cl_mem a = clCreateBuffer(clattn_env_context(t->env), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                              sizeof zeros, zeros, &err);
    cl_mem b =
        clCreateBuffer(clattn_env_context(t->env), CL_MEM_READ_WRITE, sizeof zeros, NULL, &err);
    clattn_tensor src = clattn_tensor_4d(a, CLATTN_F32, 1, 1, 4, 16);
    clattn_tensor dst = clattn_tensor_4d(b, dst_dtype, 1, 1, 4, 16);
    int status = clattn_copy(&src, NULL, &dst, queue, 0, NULL, NULL);
    clFinish(queue);
    clReleaseMemObject(a);
    clReleaseMemObject(b);
    return status;
}

static void a_second_call_hits_and_options_are_keys(test_ctx *t) {
    clattn_cache_clear(NULL);
    size_t programs, builds0, builds1, builds2, hits0, hits1;
    cl_command_queue q = clattn_env_queue(t->env);
    CHECK_OK(t, small_copy(t, q, CLATTN_F16));
    clattn_cache_stats(&programs, &builds0, &hits0);
    CHECK(t, programs == 1, "%zu programs after one op", programs);
    CHECK_OK(t, small_copy(t, q, CLATTN_F16));
    clattn_cache_stats(&programs, &builds1, &hits1);
    CHECK(t, programs == 1 && builds1 == builds0 && hits1 == hits0 + 1,
          "a repeat built again: programs %zu builds %zu->%zu hits %zu->%zu", programs, builds0,
          builds1, hits0, hits1);
    CHECK_OK(t, small_copy(t, q, CLATTN_BF16)); /* other options: another program */
    clattn_cache_stats(&programs, &builds2, NULL);
    CHECK(t, programs == 2 && builds2 == builds1 + 1, "programs %zu builds %zu", programs, builds2);
}

/* The options of the cached copy program whose options hold `marker` ("-DDST_T=f32 "), less
 * what the build appended (CLATTN_BUILD_OPTIONS): what clattn__create_kernel takes to lend its
 * kernels. */
static bool copy_program_options(test_ctx *t, const char *marker, char *options, size_t capacity) {
    clattn__cached_program *programs = NULL;
    size_t count = 0, found = 0;
    int status = clattn__cache_snapshot(clattn_env_context(t->env), clattn_env_device(t->env),
                                        &programs, &count);
    for (size_t i = 0; status == CLATTN_SUCCESS && i < count; ++i)
        if (strstr(programs[i].options, marker) && found++ == 0)
            snprintf(options, capacity, "%s", programs[i].options);
    clattn__cache_snapshot_free(programs, count);
    if (found != 1) {
        test_fail_at(t, __FILE__, __LINE__, "%s, %zu copy programs with \"%s\" cached",
                     clattn_status_name(status), found, marker);
        return false;
    }
    char appended[512];
    const char *extra = getenv("CLATTN_BUILD_OPTIONS");
    snprintf(appended, sizeof appended, " %s", extra ? extra : "");
    const size_t length = strlen(options), tail = strlen(appended);
    if (length >= tail && strcmp(options + length - tail, appended) == 0)
        options[length - tail] = '\0';
    return true;
}

/* A repeat call takes the kernel its program keeps instead of creating one, and gives it back
 * after the enqueue; a kernel one caller holds is lent to no other meanwhile (that one gets a
 * kernel of its own, kept too); a kernel held across clattn_cache_clear is its holder's to
 * release. */
static void kernels_are_kept_and_lent_to_one_caller_at_a_time(test_ctx *t) {
    clattn_cache_clear(NULL);
    cl_command_queue q = clattn_env_queue(t->env);
    size_t kept, lent;
    CHECK_OK(t, small_copy(t, q, CLATTN_F32));
    CHECK_OK(t, small_copy(t, q, CLATTN_F32));
    clattn__kept_kernels(&kept, &lent);
    CHECK(t, kept == 1 && lent == 0, "two copies: %zu kernels kept, %zu lent", kept, lent);
    cl_context context = clattn_env_context(t->env);
    cl_device_id device = clattn_env_device(t->env);
    char options[2048];
    if (!copy_program_options(t, "-DDST_T=f32 ", options, sizeof options)) return;
    cl_kernel a = NULL, b = NULL, c = NULL;
    CHECK_OK(t, clattn__create_kernel(context, device, "heads.cl", options, "copy4d", &a));
    CHECK_OK(t, clattn__create_kernel(context, device, "heads.cl", options, "copy4d", &b));
    clattn__kept_kernels(&kept, &lent);
    CHECK(t, a && b && a != b && kept == 2 && lent == 2, "two holders: %p %p, %zu kept, %zu lent",
          (void *)a, (void *)b, kept, lent);
    clattn__release_kernel(b);
    CHECK_OK(t, clattn__create_kernel(context, device, "heads.cl", options, "copy4d", &c));
    CHECK(t, c == b, "the kernel given back was not lent again");
    clattn__release_kernel(c);
    clattn__kept_kernels(&kept, &lent);
    CHECK(t, kept == 2 && lent == 1, "one holder: %zu kept, %zu lent", kept, lent);
    clattn_cache_clear(NULL); /* `a` is held: the clear leaves it to its holder */
    clattn__kept_kernels(&kept, &lent);
    CHECK(t, kept == 0, "%zu kernels kept after the clear", kept);
    char name[32] = "";
    CHECK(t,
          clGetKernelInfo(a, CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL) == CL_SUCCESS &&
              strcmp(name, "copy4d") == 0,
          "the kernel held across the clear is \"%s\"", name);
    clattn__release_kernel(a);
}

/* Buffers whose deletion is counted (a destructor callback each). */
typedef struct tracked_buffers {
    atomic_int deleted;
    int count;
    cl_mem list[32];
} tracked_buffers;

static void CL_CALLBACK count_deletion(cl_mem buffer, void *user) {
    (void)buffer;
    atomic_fetch_add((atomic_int *)user, 1);
}

/* A zeroed contiguous tensor on a buffer of its own, counted in `tracked`. */
static clattn_tensor tracked_tensor(test_ctx *t, tracked_buffers *tracked, clattn_dtype dtype,
                                    int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    const size_t bytes = (size_t)(d0 * d1 * d2 * d3) * clattn_dtype_size(dtype);
    void *zeros = calloc(1, bytes);
    cl_int err = CL_OUT_OF_HOST_MEMORY;
    cl_mem buffer =
        zeros ? clCreateBuffer(clattn_env_context(t->env), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                               bytes, zeros, &err)
              : NULL;
    free(zeros);
    if (buffer &&
        clSetMemObjectDestructorCallback(buffer, count_deletion, &tracked->deleted) != CL_SUCCESS)
        test_fail_at(t, __FILE__, __LINE__, "clSetMemObjectDestructorCallback failed");
    const int capacity = (int)(sizeof tracked->list / sizeof tracked->list[0]);
    if (buffer && tracked->count < capacity) tracked->list[tracked->count++] = buffer;
    return clattn_tensor_4d(buffer, dtype, d0, d1, d2, d3);
}

static bool all_deleted(void *arg) {
    tracked_buffers *tracked = arg;
    return atomic_load(&tracked->deleted) >= tracked->count;
}

/* Waits up to a second for `tracked`'s buffers to be deleted; how many were. */
static int deleted_after_release(tracked_buffers *tracked) {
    test_wait_for(all_deleted, tracked);
    return atomic_load(&tracked->deleted);
}

/* The kernels the cache keeps for the next call name none of a finished call's buffers: each
 * op family's buffers (its tensors, mask tensors, and the scratch it allocates) are deleted when
 * the caller releases them. Some drivers (Mesa's rusticl) retain what a kernel's arguments name,
 * so a kept kernel that still named them would keep them, and the memory, alive. */
static void kept_kernels_hold_no_buffer_of_a_call(test_ctx *t) {
    cl_command_queue queue = clattn_env_queue(t->env);
    tracked_buffers tracked = {.count = 0};
    atomic_init(&tracked.deleted, 0);
    const int64_t B = 1, H = 2, Sq = 4, Sk = 40, D = 16, Sd = 1024, E = H * D;
    clattn_tensor q = tracked_tensor(t, &tracked, CLATTN_F32, B, H, Sq, D);
    clattn_tensor k = tracked_tensor(t, &tracked, CLATTN_F32, B, H, Sk, D);
    clattn_tensor v = tracked_tensor(t, &tracked, CLATTN_F32, B, H, Sk, D);
    clattn_tensor out = tracked_tensor(t, &tracked, CLATTN_F32, B, H, Sq, D);
    clattn_tensor dout = tracked_tensor(t, &tracked, CLATTN_F32, B, H, Sq, D);
    clattn_tensor lse = tracked_tensor(t, &tracked, CLATTN_F32, 1, B, H, Sq);
    clattn_tensor bias = tracked_tensor(t, &tracked, CLATTN_F32, 1, H, Sq, Sk);
    clattn_tensor dq = tracked_tensor(t, &tracked, CLATTN_F32, B, H, Sq, D);
    clattn_tensor dk = tracked_tensor(t, &tracked, CLATTN_F32, B, H, Sk, D);
    clattn_tensor dv = tracked_tensor(t, &tracked, CLATTN_F32, B, H, Sk, D);
    clattn_tensor copied = tracked_tensor(t, &tracked, CLATTN_F16, B, H, Sk, D);
    clattn_tensor probs = tracked_tensor(t, &tracked, CLATTN_F32, 1, H, Sq, Sk);
    /* decoding: one query against many keys, split where the device wants more work-groups */
    clattn_tensor q1 = tracked_tensor(t, &tracked, CLATTN_F32, B, H, 1, D);
    clattn_tensor kd = tracked_tensor(t, &tracked, CLATTN_F32, B, H, Sd, D);
    clattn_tensor out1 = tracked_tensor(t, &tracked, CLATTN_F32, B, H, 1, D);
    /* MHA: self-attention over Sk tokens of E */
    clattn_tensor x = tracked_tensor(t, &tracked, CLATTN_F32, 1, B, Sk, E);
    clattn_tensor w_in = tracked_tensor(t, &tracked, CLATTN_F32, 1, 1, 3 * E, E);
    clattn_tensor w_out = tracked_tensor(t, &tracked, CLATTN_F32, 1, 1, E, E);
    clattn_tensor y = tracked_tensor(t, &tracked, CLATTN_F32, 1, B, Sk, E);
    clattn_mask mask;
    memset(&mask, 0, sizeof mask);
    mask.bias = &bias;
    const clattn_mha_params params = {
        .num_heads = (int)H, .in_proj_weight = &w_in, .out_proj_weight = &w_out};
    const int made = tracked.count;
    CHECK_OK(t, clattn_copy(&k, NULL, &copied, queue, 0, NULL, NULL));
    CHECK_OK(t, clattn_softmax(&bias, 1.0f, NULL, &probs, &lse, queue, 0, NULL, NULL));
    CHECK_OK(t, clattn_attention(&q, &k, &v, 0.0f, &mask, &out, &lse, queue, 0, NULL, NULL));
    /* (under Oclgrind's --uninitialized, which misreads what these read: tests/harness.h) */
    if (!test_under_uninit_checker()) {
        CHECK_OK(t, clattn_attention_backward(&q, &k, &v, &out, &dout, &lse, 0.0f, &mask, &dq, &dk,
                                              &dv, NULL, queue, 0, NULL, NULL));
        CHECK_OK(t, clattn_attention(&q1, &kd, &kd, 0.0f, NULL, &out1, NULL, queue, 0, NULL, NULL));
        CHECK_OK(t, clattn_linear_attention(&q, &k, &v, NULL, &out, NULL, queue, 0, NULL, NULL));
        CHECK_OK(t, clattn_linear_attention_backward(&q, &k, &v, &dout, NULL, &dq, &dk, &dv, NULL,
                                                     queue, 0, NULL, NULL));
        CHECK_OK(t, clattn_mha_forward(&x, &x, &x, &params, &y, NULL, queue, 0, NULL, NULL));
    }
    clFinish(queue);
    for (int i = 0; i < tracked.count; ++i) clReleaseMemObject(tracked.list[i]);
    const int deleted = deleted_after_release(&tracked);
    CHECK(t, made == 19 && deleted == made,
          "%d of the calls' %d buffers deleted after their release", deleted, made);
    CHECK(t, test_scratch_left(0) == 0, "%ld scratch buffers alive after the calls",
          test_scratch_left(0));
}

/* A thread records the arguments of 16 kernels it holds at once: past that, a call gets a new
 * kernel, never kept, rather than a kept one whose arguments nothing would check or clear (the
 * idle kept kernel goes back to its slot). No kernel given back names a buffer. */
static void a_kernel_past_the_thread_record_is_new(test_ctx *t) {
    clattn_cache_clear(NULL);
    cl_command_queue queue = clattn_env_queue(t->env);
    CHECK_OK(t, small_copy(t, queue, CLATTN_F32));
    CHECK_OK(t, small_copy(t, queue, CLATTN_F16));
    cl_context context = clattn_env_context(t->env);
    cl_device_id device = clattn_env_device(t->env);
    char f32[2048], f16[2048];
    if (!copy_program_options(t, "-DDST_T=f32 ", f32, sizeof f32) ||
        !copy_program_options(t, "-DDST_T=f16 ", f16, sizeof f16))
        return;
    tracked_buffers tracked = {.count = 0};
    atomic_init(&tracked.deleted, 0);
    clattn_tensor x = tracked_tensor(t, &tracked, CLATTN_F32, 1, 1, 1, 64);
    enum { HELD = 16 };
    cl_kernel held[HELD + 1] = {NULL}, idle = NULL;
    /* the f32 copy's kept kernel, idle; then 16 kernels of the f16 copy's program held */
    int status = clattn__create_kernel(context, device, "heads.cl", f32, "copy4d", &idle);
    clattn__release_kernel(idle);
    for (int i = 0; i < HELD && status == CLATTN_SUCCESS; ++i) {
        status = clattn__create_kernel(context, device, "heads.cl", f16, "copy4d", &held[i]);
        if (status == CLATTN_SUCCESS) status = clattn__set_buffer_arg(held[i], 0, x.buffer);
    }
    if (status == CLATTN_SUCCESS)
        status = clattn__create_kernel(context, device, "heads.cl", f32, "copy4d", &held[HELD]);
    if (status == CLATTN_SUCCESS) status = clattn__set_buffer_arg(held[HELD], 0, x.buffer);
    size_t kept, lent, kept_after, lent_after;
    clattn__kept_kernels(&kept, &lent);
    const bool new_one = held[HELD] && held[HELD] != idle;
    clReleaseMemObject(x.buffer);
    for (int i = 0; i <= HELD; ++i) clattn__release_kernel(held[i]);
    clattn__kept_kernels(&kept_after, &lent_after);
    CHECK_OK(t, status);
    CHECK(t, new_one, "the 17th kernel held is the idle kept one");
    CHECK(t, kept == 13 && lent == 12, "held: %zu kept, %zu lent (13, 12 expected)", kept, lent);
    CHECK(t, kept_after == 13 && lent_after == 0, "after: %zu kept, %zu lent", kept_after,
          lent_after);
    CHECK(t, deleted_after_release(&tracked) == 1, "the buffer the kernels named is alive");
}

/* Keeps a kernel of the one cached program under the test's name "other" (a kernel of the same
 * program): whether the cache kept it. */
static bool keep_other(test_ctx *t) {
    clattn__cached_program *programs = NULL;
    size_t count = 0;
    if (clattn__cache_snapshot(clattn_env_context(t->env), clattn_env_device(t->env), &programs,
                               &count) != CLATTN_SUCCESS)
        return false;
    cl_int err = CL_INVALID_PROGRAM;
    cl_kernel other = count == 1 ? clCreateKernel(programs[0].program, "copy4d", &err) : NULL;
    if (other) clattn__cache_keep_kernel(programs[0].program, "other", other);
    clattn__cache_snapshot_free(programs, count);
    const bool kept = other && clattn__cache_take_back_kernel(other, NULL);
    if (other) clReleaseKernel(other);
    return kept;
}

/* A burst of calls on one kernel fills its program's slots with copies of it; a kernel of
 * another name then takes the slot of an idle copy, so that the program's other kernels are
 * kept too, but never the slot of a copy a call holds. */
static void another_kernel_takes_an_idle_copys_slot(test_ctx *t) {
    clattn_cache_clear(NULL);
    CHECK_OK(t, small_copy(t, clattn_env_queue(t->env), CLATTN_F32));
    cl_context context = clattn_env_context(t->env);
    cl_device_id device = clattn_env_device(t->env);
    char options[2048];
    if (!copy_program_options(t, "-DDST_T=f32 ", options, sizeof options)) return;
    cl_kernel held[12] = {NULL};
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < 12 && status == CLATTN_SUCCESS; ++i)
        status = clattn__create_kernel(context, device, "heads.cl", options, "copy4d", &held[i]);
    const bool kept_beside_lent = keep_other(t);
    for (int i = 0; i < 12; ++i) clattn__release_kernel(held[i]);
    CHECK_OK(t, status);
    CHECK(t, !kept_beside_lent, "a kernel took the slot of a copy a call holds");
    const bool kept_beside_idle = keep_other(t);
    size_t kept, lent;
    clattn__kept_kernels(&kept, &lent);
    CHECK(t, kept_beside_idle && kept == 12 && lent == 0, "other kept: %d; %zu kept, %zu lent",
          kept_beside_idle, kept, lent);
}

/* A kept kernel carries its last call's scalars (and NULL buffers): an enqueue whose call left an
 * argument unset is refused, as a new kernel's would be, before the driver runs it. */
static void an_argument_the_call_left_unset_is_refused(test_ctx *t) {
    clattn_cache_clear(NULL);
    cl_command_queue queue = clattn_env_queue(t->env);
    CHECK_OK(t, small_copy(t, queue, CLATTN_F32));
    char options[2048];
    if (!copy_program_options(t, "-DDST_T=f32 ", options, sizeof options)) return;
    cl_kernel kernel = NULL;
    CHECK_OK(t, clattn__create_kernel(clattn_env_context(t->env), clattn_env_device(t->env),
                                      "heads.cl", options, "copy4d", &kernel));
    size_t kept, lent;
    clattn__kept_kernels(&kept, &lent);
    clattn__call call;
    int status = clattn__begin_call(&call, queue, 0, NULL, NULL);
    const size_t one = 1;
    if (status == CLATTN_SUCCESS) status = clattn__set_uint_arg(kernel, 1, 0);
    if (status == CLATTN_SUCCESS) status = clattn__enqueue(&call, kernel, 1, &one, &one);
    const char *message = clattn_last_error();
    const bool named = strstr(message, "argument 0 of copy4d was not set") != NULL;
    clattn__release_kernel(kernel);
    clFinish(queue);
    CHECK(t, kept == 1 && lent == 1, "not the kept kernel: %zu kept, %zu lent", kept, lent);
    CHECK(t, status == CL_INVALID_KERNEL_ARGS && named, "the enqueue gave %s: %s",
          clattn_status_name(status), message);
}

/* One copy of `rows` rows of 8 floats, `stride` apart from `offset` in src, into dst's first
 * rows: whether the call succeeded and dst then holds them. */
static bool copy_view_holds(test_ctx *t, cl_mem src, cl_mem dst, const float *values, size_t offset,
                            int64_t rows, int64_t stride) {
    cl_command_queue queue = clattn_env_queue(t->env);
    clattn_tensor from = clattn_tensor_4d(src, CLATTN_F32, 1, 1, rows, 8);
    clattn_tensor to = clattn_tensor_4d(dst, CLATTN_F32, 1, 1, rows, 8);
    from.offset = offset, from.strides[2] = stride;
    float got[64];
    if (clattn_copy(&from, NULL, &to, queue, 0, NULL, NULL) != CLATTN_SUCCESS ||
        clEnqueueReadBuffer(queue, dst, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL) != CL_SUCCESS)
        return false;
    for (int64_t r = 0; r < rows; ++r)
        for (int c = 0; c < 8; ++c)
            if (got[r * 8 + c] != values[offset + r * stride + c]) return false;
    return true;
}

/* One softmax of 2 rows of 8 logits (`x`) at `scale` into y: whether the call succeeded and y
 * then holds it, to float rounding. */
static bool softmax_holds(test_ctx *t, cl_mem x, cl_mem y, const float *logits, float scale) {
    cl_command_queue queue = clattn_env_queue(t->env);
    clattn_tensor in = clattn_tensor_4d(x, CLATTN_F32, 1, 1, 2, 8);
    clattn_tensor out = clattn_tensor_4d(y, CLATTN_F32, 1, 1, 2, 8);
    float got[16];
    if (clattn_softmax(&in, scale, NULL, &out, NULL, queue, 0, NULL, NULL) != CLATTN_SUCCESS ||
        clEnqueueReadBuffer(queue, y, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL) != CL_SUCCESS)
        return false;
    for (int r = 0; r < 2; ++r) {
        double sum = 0;
        for (int c = 0; c < 8; ++c) sum += exp((double)scale * logits[r * 8 + c]);
        for (int c = 0; c < 8; ++c)
            if (fabs(got[r * 8 + c] - exp((double)scale * logits[r * 8 + c]) / sum) > 1e-6)
                return false;
    }
    return true;
}

/* A kept kernel holds its last call's scalars, and a call sets only those that differ
 * (kernel_args.c): each call's offsets and strides (unsigned), and scales (float), set, changed
 * back, and changed again, are the ones its kernel runs with (rows that start on 8-float
 * multiples: one copy program); and a repeat call sets fewer arguments than the first. */
static void a_kept_kernel_runs_each_calls_scalars(test_ctx *t) {
    clattn_cache_clear(NULL);
    float values[256];
    for (int i = 0; i < 256; ++i) values[i] = (float)i;
    cl_context context = clattn_env_context(t->env);
    cl_int err_src, err_dst;
    cl_mem src = clCreateBuffer(context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof values,
                                values, &err_src);
    cl_mem dst = clCreateBuffer(context, CL_MEM_READ_WRITE, sizeof values, NULL, &err_dst);
    CHECK(t, err_src == CL_SUCCESS && err_dst == CL_SUCCESS, "clCreateBuffer: %d, %d", err_src,
          err_dst);
    static const struct {
        size_t offset;
        int64_t rows, stride;
    } views[] = {{0, 4, 8}, {16, 4, 8}, {0, 4, 8}, {16, 4, 32}, {8, 8, 24}, {16, 4, 8}, {16, 4, 8}};
    enum { CALLS = sizeof views / sizeof views[0] };
    size_t sets[CALLS];
    for (size_t i = 0; i < CALLS; ++i) {
        const size_t before = clattn__args_driver_sets();
        CHECK(t,
              copy_view_holds(t, src, dst, values, views[i].offset, views[i].rows, views[i].stride),
              "call %zu: rows %lld, %lld apart from %zu, copied wrong", i, (long long)views[i].rows,
              (long long)views[i].stride, views[i].offset);
        sets[i] = clattn__args_driver_sets() - before;
    }
    size_t kept, lent;
    clattn__kept_kernels(&kept, &lent);
    CHECK(t, kept == 1 && lent == 0, "%zu kernels kept, %zu lent (1, 0 expected)", kept, lent);
    CHECK(t, sets[CALLS - 1] < sets[0], "a repeat call set %zu arguments, the first %zu",
          sets[CALLS - 1], sets[0]);
    static const float scales[] = {1.0f, 2.0f, 1.0f, -0.5f, 2.0f};
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; ++i)
        CHECK(t, softmax_holds(t, src, dst, values + 240, scales[i]),
              "softmax %zu at scale %g wrong", i, scales[i]);
    clReleaseMemObject(src);
    clReleaseMemObject(dst);
}

static void clearing_one_context_keeps_the_others(test_ctx *t) {
    clattn_cache_clear(NULL);
    cl_device_id device = clattn_env_device(t->env);
    cl_int err;
    cl_context other = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    CHECK(t, err == CL_SUCCESS, "clCreateContext: %d", err);
    cl_command_queue other_queue = clCreateCommandQueue(other, device, 0, &err);
    float zeros[64] = {0};
    cl_mem a =
        clCreateBuffer(other, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zeros, zeros, &err);
    clattn_tensor v = clattn_tensor_4d(a, CLATTN_F32, 1, 1, 1, 32);
    clattn_tensor w = v;
    w.offset = 32;
    int status = clattn_copy(&v, NULL, &w, other_queue, 0, NULL, NULL);
    clFinish(other_queue);
    int mine = small_copy(t, clattn_env_queue(t->env), CLATTN_F32);
    size_t before, after;
    clattn_cache_stats(&before, NULL, NULL);
    clattn_cache_clear(other);
    clattn_cache_stats(&after, NULL, NULL);
    clReleaseMemObject(a);
    clReleaseCommandQueue(other_queue);
    clReleaseContext(other);
    CHECK(t, status == CLATTN_SUCCESS && mine == CLATTN_SUCCESS, "copies: %s %s",
          clattn_status_name(status), clattn_status_name(mine));
    CHECK(t, before == 2 && after == 1, "programs before %zu after %zu", before, after);
}

/* dir/name holding text. */
static bool write_kernel_file(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return false;
    fputs(text, f);
    return fclose(f) == 0;
}

/* A scratch kernel directory holding the given files. */
static bool make_kernel_dir(char *dir, size_t capacity, const char *common, const char *heads) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, capacity, "%s/clattn-kernels-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(dir) && (!common || write_kernel_file(dir, "common.cl", common)) &&
           (!heads || write_kernel_file(dir, "heads.cl", heads));
}

static void remove_kernel_dir(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/common.cl", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/heads.cl", dir);
    remove(path);
    rmdir(dir);
}

typedef struct log_capture {
    int calls, status;
} log_capture;

static void count_log(int status, const char *message, void *user) {
    (void)message;
    log_capture *c = user;
    ++c->calls;
    c->status = status;
}

static void a_build_failure_returns_its_log_with_file_and_line(test_ctx *t) {
    char dir[256];
    CHECK(t,
          make_kernel_dir(dir, sizeof dir, "#define CLATTN_COMMON_CL 1\n",
                          "/* line 1 */\n\n__kernel void copy4d(void) { this is not C; }\n"),
          "cannot make a kernel directory");
    setenv("CLATTN_KERNEL_DIR", dir, 1);
    log_capture c = {0, 0};
    clattn_set_log_callback(count_log, &c);
    int status = small_copy(t, clattn_env_queue(t->env), CLATTN_F32);
    clattn_set_log_callback(NULL, NULL);
    char message[4096];
    snprintf(message, sizeof message, "%s", clattn_last_error());
    /* a missing file is its own status */
    remove_kernel_dir(dir);
    int missing = small_copy(t, clattn_env_queue(t->env), CLATTN_F32);
    unsetenv("CLATTN_KERNEL_DIR");
    CHECK(t, status == CLATTN_ERR_BUILD_FAILED, "broken source -> %s", clattn_status_name(status));
    CHECK(t, strstr(message, "heads.cl:3") != NULL, "the log does not point at heads.cl:3:\n%s",
          message);
    CHECK(t, c.calls >= 1 && c.status == CLATTN_ERR_BUILD_FAILED, "log callback: %d calls",
          c.calls);
    CHECK(t, missing == CLATTN_ERR_KERNEL_SOURCE, "missing source -> %s",
          clattn_status_name(missing));
}

/* cl/NAME of the source tree, malloc'ed (NULL when unreadable). */
static char *real_source(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/cl/%s", CLATTN_SOURCE_DIR, name);
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    long n = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1)) &&
        fread(text, 1, (size_t)n, f) == (size_t)n)
        text[n] = '\0';
    else
        free(text), text = NULL;
    if (f) fclose(f);
    return text;
}

/* The real sources served from a directory build their own program (the text hashes differently
 * from the embedded key), and an edit there is picked up in the same process: the program cache
 * keys the text again when a file's size or time changes, not only on a miss. */
static void kernel_dir_serves_the_real_sources(test_ctx *t) {
    char dir[256];
    char *common = real_source("common.cl"), *heads = real_source("heads.cl");
    const bool made = common && heads && make_kernel_dir(dir, sizeof dir, common, heads);
    free(common);
    free(heads);
    CHECK(t, made, "cannot copy cl/common.cl and cl/heads.cl into a kernel directory");
    /* the copies are the embedded text: a disk cache would hand back an earlier test's build */
    test_saved_env disk = test_env_set("CLATTN_CACHE_DIR", NULL);
    setenv("CLATTN_KERNEL_DIR", dir, 1);
    size_t builds0, builds1;
    clattn_cache_stats(NULL, &builds0, NULL);
    int status = small_copy(t, clattn_env_queue(t->env), CLATTN_F16);
    clattn_cache_stats(NULL, &builds1, NULL);
    const bool edited = write_kernel_file(dir, "heads.cl", "__kernel void copy4d(void) { x }\n");
    int broken = small_copy(t, clattn_env_queue(t->env), CLATTN_F16);
    unsetenv("CLATTN_KERNEL_DIR");
    test_env_restore(&disk);
    remove_kernel_dir(dir);
    CHECK(t, status == CLATTN_SUCCESS, "-> %s: %s", clattn_status_name(status),
          clattn_last_error());
    CHECK(t, builds1 == builds0 + 1, "builds %zu -> %zu", builds0, builds1);
    CHECK(t, edited && broken == CLATTN_ERR_BUILD_FAILED, "the edited heads.cl -> %s",
          clattn_status_name(broken));
}

/* Debugging options pass through; options that relax IEEE semantics are refused. */
static void build_options_from_the_environment(test_ctx *t) {
    const char *saved = getenv("CLATTN_BUILD_OPTIONS"); /* the Oclgrind lane sets it */
    char *copy = saved ? strdup(saved) : NULL;
    setenv("CLATTN_BUILD_OPTIONS", "-cl-fast-relaxed-math", 1);
    int refused = small_copy(t, clattn_env_queue(t->env), CLATTN_F32);
    setenv("CLATTN_BUILD_OPTIONS", "-cl-opt-disable", 1);
    int accepted = small_copy(t, clattn_env_queue(t->env), CLATTN_F32);
    if (copy)
        setenv("CLATTN_BUILD_OPTIONS", copy, 1);
    else
        unsetenv("CLATTN_BUILD_OPTIONS");
    free(copy);
    CHECK(t, refused == CLATTN_ERR_INVALID_ARGUMENT, "fast math -> %s",
          clattn_status_name(refused));
    CHECK(t, accepted == CLATTN_SUCCESS, "-cl-opt-disable -> %s: %s", clattn_status_name(accepted),
          clattn_last_error());
}

/* ---- threads ---- */

typedef struct worker {
    test_ctx *t;
    cl_context context;
    cl_command_queue queue;
    int index, failures;
    char message[256];
} worker;

/* A transpose of a [3, n] matrix: every thread needs the same program at the same time, so they
 * race to build it and must end up sharing one. Returns 0 when the result is right. */
static int worker_copy(worker *w, int n, const float *in, float *out, cl_mem a, cl_mem b) {
    clattn_tensor src = clattn_tensor_4d(a, CLATTN_F32, 1, 1, 3, n);
    static const int swap[4] = {0, 1, 3, 2};
    src = clattn_tensor_permute(src, swap);
    clattn_tensor dst = clattn_tensor_4d(b, CLATTN_F32, 1, 1, n, 3);
    int status = clattn_copy(&src, NULL, &dst, w->queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS)
        status = clEnqueueReadBuffer(w->queue, b, CL_TRUE, 0, sizeof(float) * 3 * (size_t)n, out, 0,
                                     NULL, NULL);
    for (int i = 0; status == CLATTN_SUCCESS && i < n; ++i)
        for (int r = 0; r < 3; ++r)
            if (out[i * 3 + r] != in[r * n + i]) status = -1;
    return status;
}

/* A causal softmax of 3 rows of n, against the host's. */
static int worker_softmax(worker *w, int n, const float *in, float *out, cl_mem a, cl_mem b) {
    clattn_tensor x = clattn_tensor_4d(a, CLATTN_F32, 1, 1, 3, n);
    clattn_tensor y = clattn_tensor_4d(b, CLATTN_F32, 1, 1, 3, n);
    clattn_mask m;
    memset(&m, 0, sizeof m);
    m.causal = 1;
    int status = clattn_softmax(&x, 1e-3f, &m, &y, NULL, w->queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS)
        status = clEnqueueReadBuffer(w->queue, b, CL_TRUE, 0, sizeof(float) * 3 * (size_t)n, out, 0,
                                     NULL, NULL);
    for (int r = 0; status == CLATTN_SUCCESS && r < 3; ++r) {
        double max = -INFINITY, sum = 0;
        for (int j = 0; j <= r && j < n; ++j) max = fmax(max, 1e-3 * in[r * n + j]);
        for (int j = 0; j <= r && j < n; ++j) sum += exp(1e-3 * in[r * n + j] - max);
        for (int j = 0; j < n; ++j) {
            const double want = j <= r ? exp(1e-3 * in[r * n + j] - max) / sum : 0.0;
            if (!(fabs(out[r * n + j] - want) <= 1e-6 + 1e-5 * want)) status = -1;
        }
    }
    return status;
}

/* scale * (row 0 . row j) of rows of 3 */
static double row_score(const float *in, int j, double scale) {
    return scale * ((double)in[0] * in[3 * j] + (double)in[1] * in[3 * j + 1] +
                    (double)in[2] * in[3 * j + 2]);
}

/* Attention of one query (the first row) against n keys that are also the values (k = v, rows
 * of the input), against the host's. */
static int worker_attention(worker *w, int n, const float *in, float *out, cl_mem a, cl_mem b) {
    const float scale = 1e-7f; /* scores of a few units for inputs of a few thousand */
    clattn_tensor q = clattn_tensor_4d(a, CLATTN_F32, 1, 1, 1, 3);
    clattn_tensor k = clattn_tensor_4d(a, CLATTN_F32, 1, 1, n, 3);
    clattn_tensor o = clattn_tensor_4d(b, CLATTN_F32, 1, 1, 1, 3);
    int status = clattn_attention(&q, &k, &k, scale, NULL, &o, NULL, w->queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS)
        status =
            clEnqueueReadBuffer(w->queue, b, CL_TRUE, 0, sizeof(float) * 3, out, 0, NULL, NULL);
    double max = -INFINITY, sum = 0, want[3] = {0, 0, 0};
    for (int j = 0; j < n; ++j) max = fmax(max, row_score(in, j, scale));
    for (int j = 0; j < n; ++j) {
        const double p = exp(row_score(in, j, scale) - max);
        sum += p;
        for (int c = 0; c < 3; ++c) want[c] += p * in[3 * j + c];
    }
    for (int c = 0; status == CLATTN_SUCCESS && c < 3; ++c)
        if (!(fabs(out[c] - want[c] / sum) <= 1e-4 * fabs(want[c] / sum))) status = -1;
    return status;
}

/* Rounds of a copy, a softmax and an attention in turn, each checked, on the thread's own
 * queue. */
static void *run_worker(void *arg) {
    worker *w = arg;
    static int (*const ops[3])(worker *, int, const float *, float *, cl_mem,
                               cl_mem) = {worker_copy, worker_softmax, worker_attention};
    static const char *const names[3] = {"copy", "softmax", "attention"};
    float in[3 * 40], out[3 * 40];
    for (int round = 0; round < 18 && !w->failures; ++round) {
        int n = 2 + (round * 7 + w->index * 3) % 38; /* n = 1 would be a plain copy */
        for (int i = 0; i < 3 * n; ++i) in[i] = (float)(w->index * 1000 + round * 100 + i);
        cl_int err, err2;
        cl_mem a = clCreateBuffer(w->context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                  sizeof(float) * 3 * (size_t)n, in, &err);
        cl_mem b = clCreateBuffer(w->context, CL_MEM_READ_WRITE, sizeof(float) * 3 * (size_t)n,
                                  NULL, &err2);
        const int op = (round + w->index) % 3;
        int status = err != CL_SUCCESS    ? err
                     : err2 != CL_SUCCESS ? err2
                                          : ops[op](w, n, in, out, a, b);
        if (status != CLATTN_SUCCESS) {
            w->failures = 1;
            snprintf(w->message, sizeof w->message, "thread %d round %d (%s, n %d): %s %s",
                     w->index, round, names[op], n, clattn_status_name(status),
                     status == -1 ? "wrong result" : clattn_last_error());
        }
        if (a) clReleaseMemObject(a);
        if (b) clReleaseMemObject(b);
    }
    return NULL;
}

static void threads_on_their_own_queues_share_the_cache(test_ctx *t) {
    if (test_platform_is(t, "Oclgrind"))
        return test_skip(t, "the Oclgrind simulator runs one kernel at a time (it asserts)");
    /* one cold-cache run in four aborted inside PoCL (pocl_release_dlhandle_cache: Assertion
     * `found->ref_count > 0'), with the program built once and shared, as on every device */
    if (test_is_pocl31_basic(t))
        return test_skip(t, "PoCL 3.1 basic asserts in its kernel-library cache when threads run "
                            "kernels at once (driver bug)");
    clattn_cache_clear(NULL);
    enum { THREADS = 4 };
    pthread_t threads[THREADS];
    worker workers[THREADS];
    cl_context context = clattn_env_context(t->env);
    int started = 0;
    for (int i = 0; i < THREADS; ++i) {
        cl_int err;
        workers[i] = (worker){t, context, NULL, i, 0, ""};
        workers[i].queue = clCreateCommandQueue(context, clattn_env_device(t->env), 0, &err);
        if (err != CL_SUCCESS) break;
        if (pthread_create(&threads[i], NULL, run_worker, &workers[i]) != 0) {
            clReleaseCommandQueue(workers[i].queue);
            break;
        }
        ++started;
    }
    size_t programs, after_clear;
    for (int i = 0; i < started; ++i) pthread_join(threads[i], NULL);
    for (int i = 0; i < started; ++i) clReleaseCommandQueue(workers[i].queue);
    clattn_cache_stats(&programs, NULL, NULL);
    clattn_cache_clear(NULL); /* releases every program (and CLBlast's) for the teardown */
    clattn_cache_stats(&after_clear, NULL, NULL);
    CHECK(t, started == THREADS, "only %d of %d threads started", started, THREADS);
    for (int i = 0; i < THREADS; ++i) CHECK(t, workers[i].failures == 0, "%s", workers[i].message);
    /* one program per op: the threads raced to build each and share the winner's */
    CHECK(t, programs == 3, "%zu programs for the copy, softmax and attention kernels", programs);
    CHECK(t, after_clear == 0, "%zu programs left after clattn_cache_clear", after_clear);
}

static const test_case cases[] = {
    {"a_second_call_hits_and_options_are_keys", a_second_call_hits_and_options_are_keys},
    {"kernels_are_kept_and_lent_to_one_caller_at_a_time",
     kernels_are_kept_and_lent_to_one_caller_at_a_time},
    {"kept_kernels_hold_no_buffer_of_a_call", kept_kernels_hold_no_buffer_of_a_call},
    {"a_kernel_past_the_thread_record_is_new", a_kernel_past_the_thread_record_is_new},
    {"another_kernel_takes_an_idle_copys_slot", another_kernel_takes_an_idle_copys_slot},
    {"an_argument_the_call_left_unset_is_refused", an_argument_the_call_left_unset_is_refused},
    {"a_kept_kernel_runs_each_calls_scalars", a_kept_kernel_runs_each_calls_scalars},
    {"clearing_one_context_keeps_the_others", clearing_one_context_keeps_the_others},
    {"a_build_failure_returns_its_log_with_file_and_line",
     a_build_failure_returns_its_log_with_file_and_line},
    {"kernel_dir_serves_the_real_sources", kernel_dir_serves_the_real_sources},
    {"build_options_from_the_environment", build_options_from_the_environment},
    {"threads_on_their_own_queues_share_the_cache", threads_on_their_own_queues_share_the_cache},
};
SUITE_TAGGED(cache_suite, "cache", cases, TAG_SMOKE);
