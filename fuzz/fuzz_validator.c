/*
 * libFuzzer target: the tensor-descriptor validator (src/runtime/tensor.c) and the descriptor
 * constructors it is fed from.
 *
 * Each input describes four descriptors (q, k, v, out): which buffer (none, two buffers, two
 * overlapping sub-buffers of the first, a buffer of another context, a 1-byte buffer), how the
 * descriptor is made (raw fields, or clattn_tensor_4d then clattn_tensor_permute, or a NULL
 * pointer), dtype, offset, shape and strides; then the dtype mask, whether the call has a
 * context, and the head-dim limit; then a shape and dtype for clattn_env_alloc. It runs the
 * validator the way the ops do: clattn__check_tensor on each, then clattn__check_attention_shapes,
 * clattn__check_no_alias and clattn__check_same_shape on views that passed (the ops call those on
 * validated views only).
 *
 * Invariants: no sanitizer report; every failure is a CLATTN_ERR_* status the function documents,
 * with a message; and what the validator accepts is true, checked the slow way: the view lies
 * inside the buffer, an accepted output addresses no element twice, views that pass the alias
 * check share no byte, and accepted attention shapes agree. clattn_env_alloc succeeds exactly on
 * shapes of at most 4096 elements (past 2^40 it must refuse; the sizes in between are not
 * tried, to keep allocations small) and gives a view the validator accepts.
 */
#include "common.h"

#include <stdlib.h>
#include <string.h>

enum { BUF_NONE, BUF_A, BUF_B, BUF_SUB1, BUF_SUB2, BUF_FOREIGN, BUF_TINY, BUF_COUNT };

static struct {
    cl_context context, other;
    cl_mem mem[BUF_COUNT];
    size_t bytes[BUF_COUNT];    /* CL_MEM_SIZE */
    cl_mem root[BUF_COUNT];     /* the allocation a sub-buffer lies in */
    uint64_t origin[BUF_COUNT]; /* its byte offset there */
} g;

static cl_mem make_buffer(cl_context context, size_t bytes) {
    cl_int err;
    cl_mem m = clCreateBuffer(context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS) fuzz_fail("clCreateBuffer(%zu) -> %d", bytes, err);
    return m;
}

static cl_mem make_sub(int parent, uint64_t origin, size_t bytes) {
    cl_int err;
    cl_buffer_region region = {origin, bytes};
    cl_mem m = clCreateSubBuffer(g.mem[parent], CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION,
                                 &region, &err);
    if (err != CL_SUCCESS)
        fuzz_fail("clCreateSubBuffer(%llu) -> %d", (unsigned long long)origin, err);
    return m;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    clattn_env *env = fuzz_env();
    cl_device_id device = clattn_env_device(env);
    cl_int err;
    g.context = clattn_env_context(env);
    g.other = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (err != CL_SUCCESS) fuzz_fail("clCreateContext -> %d", err);
    cl_uint align_bits = 0;
    clGetDeviceInfo(device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
    uint64_t align = align_bits >= 8 ? align_bits / 8 : 1;
    g.mem[BUF_A] = make_buffer(g.context, 8 * align + 4096);
    g.mem[BUF_B] = make_buffer(g.context, 64);
    g.mem[BUF_SUB1] = make_sub(BUF_A, align, 3 * align);
    g.mem[BUF_SUB2] = make_sub(BUF_A, 2 * align, 4 * align + 100);
    g.mem[BUF_FOREIGN] = make_buffer(g.other, 256);
    g.mem[BUF_TINY] = make_buffer(g.context, 1);
    for (int i = 0; i < BUF_COUNT; ++i) {
        g.root[i] = i == BUF_SUB1 || i == BUF_SUB2 ? g.mem[BUF_A] : g.mem[i];
        if (g.mem[i])
            clGetMemObjectInfo(g.mem[i], CL_MEM_SIZE, sizeof g.bytes[i], &g.bytes[i], NULL);
    }
    g.origin[BUF_SUB1] = align;
    g.origin[BUF_SUB2] = 2 * align;
    fuzz_restore_signals();
    return 0;
}

typedef struct view {
    bool present; /* false: the descriptor pointer is NULL */
    int buffer;
    clattn_tensor t;
} view;

static view read_view(fuzz_reader *r) {
    view v = {true, BUF_NONE, {0}};
    uint8_t how = fuzz_u8(r);
    v.buffer = fuzz_u8(r) % BUF_COUNT;
    uint8_t d = fuzz_u8(r);
    /* the five dtypes mostly; now and then one past either end of the enum */
    clattn_dtype dtype = d < 0xe0 ? (clattn_dtype)(d % 5) : (clattn_dtype)((int)(d & 0x1f) - 16);
    cl_mem mem = g.mem[v.buffer];
    switch (how % 4) {
    case 0:
        v.present = false;
        break;
    case 1:
    case 2: {
        v.t.buffer = mem;
        v.t.dtype = dtype;
        v.t.offset = (size_t)fuzz_i64(r);
        for (int i = 0; i < 4; ++i) v.t.shape[i] = fuzz_i64(r);
        for (int i = 0; i < 4; ++i) v.t.strides[i] = fuzz_i64(r);
        break;
    }
    default: {
        int64_t dims[4];
        for (int i = 0; i < 4; ++i) dims[i] = fuzz_i64(r);
        v.t = clattn_tensor_4d(mem, dtype, dims[0], dims[1], dims[2], dims[3]);
        int perm[4];
        for (int i = 0; i < 4; ++i) perm[i] = (int)(fuzz_u8(r) % 6) - 1;
        clattn_tensor p = clattn_tensor_permute(v.t, perm);
        bool valid = true;
        int seen = 0;
        for (int i = 0; i < 4; ++i) {
            valid = valid && perm[i] >= 0 && perm[i] <= 3 && !(seen & (1 << perm[i]));
            if (perm[i] >= 0 && perm[i] <= 3) seen |= 1 << perm[i];
        }
        for (int i = 0; i < 4; ++i)
            if (p.shape[i] != v.t.shape[valid ? perm[i] : i] ||
                p.strides[i] != v.t.strides[valid ? perm[i] : i])
                fuzz_fail("clattn_tensor_permute moved dim %d wrongly", i);
        v.t = p;
        v.t.offset = (size_t)(fuzz_u8(r) % 64);
    }
    }
    return v;
}

static uint64_t elements_of(const view *v) {
    return g.bytes[v->buffer] / clattn_dtype_size(v->t.dtype);
}

/* The last element, in 128 bits: nothing to overflow. */
static unsigned __int128 last_element(const clattn_tensor *t) {
    unsigned __int128 last = t->offset;
    for (int i = 0; i < 4; ++i)
        last += (unsigned __int128)(uint64_t)(t->shape[i] - 1) * (uint64_t)t->strides[i];
    return last;
}

/* The element offsets of a small view (numel <= cap), in a malloc'ed array, sorted. */
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t *offsets_of(const clattn_tensor *t, size_t *count, size_t cap) {
    int64_t n = clattn_tensor_numel(t);
    if (n <= 0 || (uint64_t)n > cap) return NULL;
    uint64_t *out = malloc((size_t)n * sizeof *out);
    if (!out) fuzz_fail("out of memory");
    size_t k = 0;
    for (int64_t a = 0; a < t->shape[0]; ++a)
        for (int64_t b = 0; b < t->shape[1]; ++b)
            for (int64_t c = 0; c < t->shape[2]; ++c)
                for (int64_t d = 0; d < t->shape[3]; ++d)
                    out[k++] = t->offset + (uint64_t)(a * t->strides[0] + b * t->strides[1] +
                                                      c * t->strides[2] + d * t->strides[3]);
    qsort(out, k, sizeof *out, cmp_u64);
    *count = k;
    return out;
}

#define SMALL_VIEW 4096

static void check_accepted(const char *name, const view *v, cl_context context, unsigned mask,
                           bool is_output) {
    const clattn_tensor *t = &v->t;
    if (!t->buffer || (unsigned)t->dtype > CLATTN_U8 || !(mask & (1u << t->dtype)))
        fuzz_fail("%s: accepted a NULL buffer or a dtype outside the mask", name);
    if (context && v->buffer == BUF_FOREIGN)
        fuzz_fail("%s: accepted another context's buffer", name);
    for (int i = 0; i < 4; ++i)
        if (t->shape[i] <= 0 || t->strides[i] < 0)
            fuzz_fail("%s: accepted shape[%d] = %lld, strides[%d] = %lld", name, i,
                      (long long)t->shape[i], i, (long long)t->strides[i]);
    if (last_element(t) >= elements_of(v))
        fuzz_fail("%s: accepted a view past the end of its %zu-byte buffer", name,
                  g.bytes[v->buffer]);
    if (clattn__tensor_last_element(t) != (uint64_t)last_element(t))
        fuzz_fail("%s: clattn__tensor_last_element is wrong", name);
    size_t n = 0;
    uint64_t *offsets = is_output ? offsets_of(t, &n, SMALL_VIEW) : NULL;
    for (size_t i = 1; i < n; ++i)
        if (offsets[i] == offsets[i - 1])
            fuzz_fail("%s: an output view that addresses element %llu twice was accepted", name,
                      (unsigned long long)offsets[i]);
    free(offsets);
}

/* Byte ranges [lo, lo + size) of each element in the root allocation. */
static bool views_share_a_byte(const view *a, const view *b) {
    if (g.root[a->buffer] != g.root[b->buffer]) return false;
    size_t na = 0, nb = 0;
    uint64_t *oa = offsets_of(&a->t, &na, SMALL_VIEW), *ob = offsets_of(&b->t, &nb, SMALL_VIEW);
    bool shared = false;
    if (oa && ob) {
        uint64_t sa = clattn_dtype_size(a->t.dtype), sb = clattn_dtype_size(b->t.dtype);
        size_t i = 0, j = 0;
        while (i < na && j < nb && !shared) {
            uint64_t alo = g.origin[a->buffer] + oa[i] * sa, blo = g.origin[b->buffer] + ob[j] * sb;
            shared = alo < blo + sb && blo < alo + sa;
            if (alo + sa < blo + sb)
                ++i; /* the range that ends first meets nothing further in the other list */
            else
                ++j;
        }
    }
    free(oa);
    free(ob);
    return shared;
}

static void check_alloc(const int64_t shape[4], clattn_dtype dtype, bool fits) {
    clattn_tensor t;
    int status = clattn_env_alloc(fuzz_env(), dtype, shape, &t);
    FUZZ_EXPECT(status, "clattn_env_alloc", CLATTN_ERR_INVALID_SHAPE, CLATTN_ERR_DEVICE_LIMIT,
                CLATTN_ERR_UNSUPPORTED_DTYPE);
    if ((status == CLATTN_SUCCESS) != fits)
        fuzz_fail("clattn_env_alloc([%lld,%lld,%lld,%lld], dtype %d) -> %s", (long long)shape[0],
                  (long long)shape[1], (long long)shape[2], (long long)shape[3], (int)dtype,
                  clattn_status_name(status));
    if (status != CLATTN_SUCCESS) {
        if (t.buffer) fuzz_fail("clattn_env_alloc failed and left a buffer");
        return;
    }
    status = clattn__check_tensor("alloc", &t, g.context, 0x1fu, true);
    if (status != CLATTN_SUCCESS)
        fuzz_fail("clattn_env_alloc made a view the validator refuses: %s", clattn_last_error());
    clattn_tensor_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_reader r = {data, size};
    static const char *const names[4] = {"q", "k", "v", "out"};
    view v[4];
    for (int i = 0; i < 4; ++i) v[i] = read_view(&r);
    unsigned mask = fuzz_u8(&r);
    uint8_t flags = fuzz_u8(&r);
    cl_context context = flags & 1 ? NULL : g.context;
    int64_t max_head_dim = 1 + 2 * (int64_t)fuzz_u8(&r);

    bool ok[4];
    for (int i = 0; i < 4; ++i) {
        bool is_output = i == 3 || (flags & (2 << i));
        clattn__clear_error();
        int status =
            clattn__check_tensor(names[i], v[i].present ? &v[i].t : NULL, context, mask, is_output);
        FUZZ_EXPECT(status, "clattn__check_tensor", CLATTN_ERR_INVALID_ARGUMENT,
                    CLATTN_ERR_NULL_TENSOR, CLATTN_ERR_UNSUPPORTED_DTYPE, CLATTN_ERR_INVALID_SHAPE,
                    CLATTN_ERR_INVALID_STRIDES, CLATTN_ERR_DEVICE_LIMIT,
                    CLATTN_ERR_BUFFER_TOO_SMALL, CLATTN_ERR_CONTEXT_MISMATCH);
        ok[i] = status == CLATTN_SUCCESS;
        if (ok[i]) check_accepted(names[i], &v[i], context, mask, is_output);
        if (v[i].present) {
            int64_t numel = clattn_tensor_numel(&v[i].t);
            __int128 product = 1;
            for (int d = 0; d < 4 && product != 0; ++d) {
                product = v[i].t.shape[d] <= 0 ? 0 : product * v[i].t.shape[d];
                if (product > INT64_MAX) product = 0;
            }
            if (numel != (int64_t)product)
                fuzz_fail("clattn_tensor_numel = %lld, the product is %lld", (long long)numel,
                          (long long)product);
        }
    }

    /* clattn_env_alloc's shape check, on shapes it must refuse or can allocate at once */
    uint8_t alloc = fuzz_u8(&r);
    int64_t shape[4];
    for (int i = 0; i < 4; ++i) shape[i] = fuzz_i64(&r);
    if (alloc & 1) {
        clattn_dtype dtype = (clattn_dtype)((alloc >> 1) % 6);
        __int128 count = 1; /* stops growing once past the limit */
        bool positive = true;
        for (int i = 0; i < 4; ++i) {
            positive = positive && shape[i] > 0;
            if (positive && count <= ((int64_t)1 << 40)) count *= shape[i];
        }
        if (!positive || count > ((int64_t)1 << 40) || count <= SMALL_VIEW)
            check_alloc(shape, dtype, positive && count <= SMALL_VIEW && dtype <= CLATTN_U8);
    }

    /* The ops run these on validated views only. */
    if (ok[0] && ok[1] && ok[2] && ok[3]) {
        clattn__clear_error();
        int status =
            clattn__check_attention_shapes(&v[0].t, &v[1].t, &v[2].t, &v[3].t, max_head_dim);
        FUZZ_EXPECT(status, "clattn__check_attention_shapes", CLATTN_ERR_SHAPE_MISMATCH,
                    CLATTN_ERR_DEVICE_LIMIT);
        const int64_t *q = v[0].t.shape, *k = v[1].t.shape, *vv = v[2].t.shape, *o = v[3].t.shape;
        if (status == CLATTN_SUCCESS &&
            !(k[0] == q[0] && vv[0] == q[0] && o[0] == q[0] && vv[1] == k[1] && vv[2] == k[2] &&
              k[3] == q[3] && o[1] == q[1] && o[2] == q[2] && o[3] == vv[3] && q[1] % k[1] == 0 &&
              q[3] <= max_head_dim && vv[3] <= max_head_dim))
            fuzz_fail("clattn__check_attention_shapes accepted shapes that do not agree");
    }
    for (int a = 0; a < 4; ++a)
        for (int b = 0; b < 4; ++b) {
            if (a == b || !ok[a] || !ok[b]) continue;
            clattn__clear_error();
            int status = clattn__check_no_alias(names[a], &v[a].t, names[b], &v[b].t);
            FUZZ_EXPECT(status, "clattn__check_no_alias", CLATTN_ERR_ALIASING);
            if (status == CLATTN_SUCCESS && views_share_a_byte(&v[a], &v[b]))
                fuzz_fail("clattn__check_no_alias passed %s and %s, which share a byte", names[a],
                          names[b]);
            clattn__clear_error();
            status = clattn__check_same_shape(names[a], &v[a].t, names[b], &v[b].t);
            FUZZ_EXPECT(status, "clattn__check_same_shape", CLATTN_ERR_SHAPE_MISMATCH);
            if ((status == CLATTN_SUCCESS) !=
                (memcmp(v[a].t.shape, v[b].t.shape, sizeof v[a].t.shape) == 0))
                fuzz_fail("clattn__check_same_shape is wrong");
        }
    return 0;
}
