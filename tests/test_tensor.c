/* The tensor-descriptor validator (src/runtime/tensor.c) on its own. */
#include "harness.h"
#include "runtime/runtime.h"
#include "runtime/testing.h"

#include <stdint.h>
#include <string.h>

typedef struct validator_fixture {
    cl_mem buffer; /* 1000 f32 */
    cl_context context;
} validator_fixture;

static bool setup(test_ctx *t, validator_fixture *f) {
    f->context = clattn_env_context(t->env);
    f->buffer = test_buffer_whole(t, 1000 * sizeof(float)); /* the alias test cuts sub-buffers */
    return f->buffer != NULL;
}

static clattn_tensor view(const validator_fixture *f, int64_t d0, int64_t d1, int64_t d2,
                          int64_t d3) {
    return clattn_tensor_4d(f->buffer, CLATTN_F32, d0, d1, d2, d3);
}

static void accepts_exact_fits_and_broadcasts(test_ctx *t) {
    validator_fixture f;
    if (!setup(t, &f)) return;
    clattn_tensor v = view(&f, 2, 5, 10, 10); /* exactly 1000 */
    CHECK_OK(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, true));
    v = view(&f, 1, 1, 1, 1);
    v.offset = 999; /* the last element */
    CHECK_OK(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, true));
    v = view(&f, 1000000, 1, 1, 1);
    v.strides[0] = 0; /* broadcast input: a million reads of one element */
    CHECK_OK(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, false));
    v = view(&f, 4, 1, 1, 100);
    v.strides[1] = 0; /* stride 0 on a size-1 dim is not an overlap */
    CHECK_OK(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, true));
    static const int perm[4] = {0, 2, 1, 3};
    v = clattn_tensor_permute(view(&f, 2, 5, 10, 10), perm);
    CHECK_OK(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, true));
    clReleaseMemObject(f.buffer);
}

static void rejects_each_defect_with_its_status(test_ctx *t) {
    validator_fixture f;
    if (!setup(t, &f)) return;
    clattn_tensor v = view(&f, 2, 5, 10, 10);
    v.offset = 1;
    CHECK_STATUS(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, false),
                 CLATTN_ERR_BUFFER_TOO_SMALL);
    v = view(&f, 2, 5, 10, 10);
    v.dtype = CLATTN_F16; /* 2000 halves fit in 4000 bytes */
    CHECK_OK(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, false));
    v.dtype = CLATTN_I32;
    CHECK_STATUS(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, false),
                 CLATTN_ERR_UNSUPPORTED_DTYPE);
    v = view(&f, 2, 5, 10, 10);
    v.shape[3] = 0;
    CHECK_STATUS(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, false),
                 CLATTN_ERR_INVALID_SHAPE);
    v = view(&f, 2, 5, 10, 10);
    v.strides[3] = -1;
    CHECK_STATUS(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, false),
                 CLATTN_ERR_INVALID_STRIDES);
    v = view(&f, 10, 1, 1, 10);
    v.strides[0] = 9; /* rows overlap by one element: fine to read, not to write */
    CHECK_OK(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, false));
    CHECK_STATUS(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, true),
                 CLATTN_ERR_INVALID_STRIDES);
    v = view(&f, 1, 1, 1, 1);
    v.shape[0] = (int64_t)1 << 50;
    CHECK_STATUS(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, false),
                 CLATTN_ERR_DEVICE_LIMIT);
    CHECK_STATUS(t, clattn__check_tensor("v", NULL, f.context, CLATTN__FLOAT_DTYPES, false),
                 CLATTN_ERR_INVALID_ARGUMENT);
    /* offsets and extents that wrap 64 bits must not pass as small views */
    v = view(&f, 1, 1, 1, 10);
    v.offset = SIZE_MAX - 4;
    CHECK_STATUS(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, true),
                 CLATTN_ERR_BUFFER_TOO_SMALL);
    v = view(&f, 1, 1, ((int64_t)1 << 24) + 1, 2);
    v.strides[2] = ((int64_t)1 << 40) - 1;
    v.strides[3] = (int64_t)1 << 24;
    CHECK_STATUS(t, clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, true),
                 CLATTN_ERR_BUFFER_TOO_SMALL);
    clReleaseMemObject(f.buffer);
}

static void rejects_a_buffer_of_another_context(test_ctx *t) {
    cl_device_id device = clattn_env_device(t->env);
    cl_int err;
    cl_context other = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    CHECK(t, err == CL_SUCCESS, "clCreateContext: %d", err);
    cl_mem foreign = clCreateBuffer(other, CL_MEM_READ_WRITE, 64, NULL, &err);
    clattn_tensor v = clattn_tensor_4d(foreign, CLATTN_F32, 1, 1, 1, 16);
    int status =
        clattn__check_tensor("v", &v, clattn_env_context(t->env), CLATTN__FLOAT_DTYPES, false);
    clReleaseMemObject(foreign);
    clReleaseContext(other);
    CHECK(t, status == CLATTN_ERR_CONTEXT_MISMATCH, "got %s", clattn_status_name(status));
}

static void alias_check_compares_byte_ranges(test_ctx *t) {
    validator_fixture f;
    if (!setup(t, &f)) return;
    clattn_tensor a = view(&f, 1, 1, 1, 100), b = view(&f, 1, 1, 1, 100);
    b.offset = 100;
    CHECK_OK(t, clattn__check_no_alias("a", &a, "b", &b));
    b.offset = 99;
    CHECK_STATUS(t, clattn__check_no_alias("a", &a, "b", &b), CLATTN_ERR_ALIASING);
    b.dtype = CLATTN_F16; /* elements 99.. of a half view start at byte 198, inside a */
    CHECK_STATUS(t, clattn__check_no_alias("a", &a, "b", &b), CLATTN_ERR_ALIASING);
    b.offset = 200; /* byte 400: just past a */
    CHECK_OK(t, clattn__check_no_alias("a", &a, "b", &b));
    clReleaseMemObject(f.buffer);
}

/* Two sub-buffers of one allocation overlap when their byte ranges in the parent do. */
static void alias_check_sees_through_sub_buffers(test_ctx *t) {
    validator_fixture f;
    if (!setup(t, &f)) return;
    cl_int err;
    cl_buffer_region first = {0, 2048}, second = {1024, 2048};
    cl_mem a =
        clCreateSubBuffer(f.buffer, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &first, &err);
    cl_mem b = err == CL_SUCCESS ? clCreateSubBuffer(f.buffer, CL_MEM_READ_WRITE,
                                                     CL_BUFFER_CREATE_TYPE_REGION, &second, &err)
                                 : NULL;
    if (err != CL_SUCCESS) {
        if (a) clReleaseMemObject(a);
        clReleaseMemObject(f.buffer);
        return test_skip(t, "sub-buffers at 1024-byte offsets are not aligned for this device");
    }
    clattn_tensor va = clattn_tensor_4d(a, CLATTN_F32, 1, 1, 1, 512);
    clattn_tensor vb = clattn_tensor_4d(b, CLATTN_F32, 1, 1, 1, 256);
    int overlapping = clattn__check_no_alias("a", &va, "b", &vb);
    vb.offset = 256; /* parent bytes 2048.. : just past a */
    int apart = clattn__check_no_alias("a", &va, "b", &vb);
    clReleaseMemObject(a);
    clReleaseMemObject(b);
    clReleaseMemObject(f.buffer);
    CHECK(t, overlapping == CLATTN_ERR_ALIASING, "overlapping sub-buffers -> %s",
          clattn_status_name(overlapping));
    CHECK(t, apart == CLATTN_SUCCESS, "disjoint sub-buffer views -> %s", clattn_status_name(apart));
}

static void permute_and_numel(test_ctx *t) {
    clattn_tensor v = clattn_tensor_4d(NULL, CLATTN_F32, 2, 3, 4, 5);
    static const int perm[4] = {3, 0, 2, 1}, bad[4] = {0, 0, 1, 2};
    clattn_tensor p = clattn_tensor_permute(v, perm);
    CHECK(t, p.shape[0] == 5 && p.shape[1] == 2 && p.shape[2] == 4 && p.shape[3] == 3, "shape");
    CHECK(t, p.strides[0] == 1 && p.strides[1] == 60 && p.strides[2] == 5 && p.strides[3] == 20,
          "strides");
    clattn_tensor same = clattn_tensor_permute(v, bad);
    /* field by field: memcmp would read the struct's padding, which nothing initializes */
    CHECK(t,
          same.buffer == v.buffer && same.offset == v.offset && same.dtype == v.dtype &&
              memcmp(same.shape, v.shape, sizeof v.shape) == 0 &&
              memcmp(same.strides, v.strides, sizeof v.strides) == 0,
          "an invalid permutation changes nothing");
    CHECK(t, clattn_tensor_numel(&v) == 120, "numel");
    clattn_tensor huge = v;
    huge.shape[0] = huge.shape[1] = huge.shape[2] = huge.shape[3] = (int64_t)1 << 20;
    CHECK(t, clattn_tensor_numel(&huge) == 0, "an overflowing numel is 0");
    CHECK(t, clattn_dtype_size(CLATTN_BF16) == 2 && clattn_dtype_size((clattn_dtype)9) == 0,
          "size");
}

/* Dims whose row-major strides overflow int64 (fuzz/fuzz_validator found the signed overflow in
 * clattn_tensor_4d): the strides saturate at INT64_MAX, which the validator refuses. */
static void huge_dims_saturate_strides(test_ctx *t) {
    validator_fixture f;
    if (!setup(t, &f)) return;
    const int64_t big = (int64_t)1 << 40;
    clattn_tensor v = view(&f, 1, big, big, big);
    int status = clattn__check_tensor("v", &v, f.context, CLATTN__FLOAT_DTYPES, false);
    clattn_tensor p = clattn_tensor_4d(NULL, CLATTN_F32, 2, INT64_MAX, 2, 1);
    clReleaseMemObject(f.buffer);
    CHECK(t,
          v.strides[0] == INT64_MAX && v.strides[1] == INT64_MAX && v.strides[2] == big &&
              v.strides[3] == 1,
          "strides %lld,%lld,%lld,%lld", (long long)v.strides[0], (long long)v.strides[1],
          (long long)v.strides[2], (long long)v.strides[3]);
    CHECK(t, status == CLATTN_ERR_DEVICE_LIMIT, "got %s", clattn_status_name(status));
    CHECK(t, p.strides[0] == INT64_MAX && p.strides[1] == 2, "strides %lld,%lld",
          (long long)p.strides[0], (long long)p.strides[1]);
}

static const test_case cases[] = {
    {"accepts_exact_fits_and_broadcasts", accepts_exact_fits_and_broadcasts},
    {"rejects_each_defect_with_its_status", rejects_each_defect_with_its_status},
    {"rejects_a_buffer_of_another_context", rejects_a_buffer_of_another_context},
    {"alias_check_compares_byte_ranges", alias_check_compares_byte_ranges},
    {"alias_check_sees_through_sub_buffers", alias_check_sees_through_sub_buffers},
    {"permute_and_numel", permute_and_numel},
    {"huge_dims_saturate_strides", huge_dims_saturate_strides},
};
SUITE_TAGGED(tensor_suite, "tensor", cases, TAG_HOST | TAG_SMOKE);
