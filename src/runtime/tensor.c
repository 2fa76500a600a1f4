/* Tensor descriptors: constructors and the validator every op runs before its first enqueue. */
#include "tensor.h"
#include "device_facts.h"
#include "hooks.h"

#include <stdlib.h>
#include <string.h>

size_t clattn_dtype_size(clattn_dtype dtype) {
    switch (dtype) {
    case CLATTN_F32:
        return 4;
    case CLATTN_F16:
        return 2;
    case CLATTN_BF16:
        return 2;
    case CLATTN_I32:
        return 4;
    case CLATTN_U8:
        return 1;
    }
    return 0;
}

const char *clattn_dtype_name(clattn_dtype dtype) {
    switch (dtype) {
    case CLATTN_F32:
        return "f32";
    case CLATTN_F16:
        return "f16";
    case CLATTN_BF16:
        return "bf16";
    case CLATTN_I32:
        return "i32";
    case CLATTN_U8:
        return "u8";
    }
    return "?";
}

/* a * b, or INT64_MAX where that overflows: the dims are the caller's, not yet validated, and a
 * stride that large is one the validator rejects (CLATTN_ERR_DEVICE_LIMIT). */
static int64_t stride_product(int64_t a, int64_t b) {
    int64_t product;
    return __builtin_mul_overflow(a, b, &product) ? INT64_MAX : product;
}

clattn_tensor clattn_tensor_4d(cl_mem buffer, clattn_dtype dtype, int64_t d0, int64_t d1,
                               int64_t d2, int64_t d3) {
    int64_t s1 = stride_product(d2, d3);
    clattn_tensor t = {buffer, 0, dtype, {d0, d1, d2, d3}, {stride_product(d1, s1), s1, d3, 1}};
    return t;
}

clattn_tensor clattn_tensor_permute(clattn_tensor t, const int perm[4]) {
    if (!perm) return t;
    int seen = 0;
    for (int i = 0; i < 4; ++i) {
        if (perm[i] < 0 || perm[i] > 3 || (seen & (1 << perm[i]))) return t;
        seen |= 1 << perm[i];
    }
    clattn_tensor out = t;
    for (int i = 0; i < 4; ++i) {
        out.shape[i] = t.shape[perm[i]];
        out.strides[i] = t.strides[perm[i]];
    }
    return out;
}

int64_t clattn_tensor_numel(const clattn_tensor *t) {
    if (!t) return 0;
    int64_t n = 1;
    for (int i = 0; i < 4; ++i)
        if (t->shape[i] <= 0 || __builtin_mul_overflow(n, t->shape[i], &n)) return 0;
    return n;
}

uint64_t clattn__tensor_last_element(const clattn_tensor *t) {
    uint64_t last = t->offset;
    for (int i = 0; i < 4; ++i) last += (uint64_t)(t->shape[i] - 1) * (uint64_t)t->strides[i];
    return last;
}

/* Dims larger than 1, sorted by stride: an output view is one-to-one exactly when each such dim
 * steps over everything the smaller-stride dims span (the dims nest, none interleave). */
static bool view_overlaps_itself(const clattn_tensor *t) {
    int dims[4], count = 0;
    for (int i = 0; i < 4; ++i)
        if (t->shape[i] > 1) dims[count++] = i;
    for (int a = 1; a < count; ++a)
        for (int b = a; b > 0 && t->strides[dims[b]] < t->strides[dims[b - 1]]; --b) {
            int swap = dims[b];
            dims[b] = dims[b - 1];
            dims[b - 1] = swap;
        }
    uint64_t span = 1; /* elements covered by the dims with smaller strides */
    for (int i = 0; i < count; ++i) {
        int d = dims[i];
        if ((uint64_t)t->strides[d] < span) return true;
        span = (uint64_t)t->strides[d] * (uint64_t)(t->shape[d] - 1) + span;
    }
    return false;
}

/* Largest dim and stride accepted: keeps every offset computation inside 63 bits. */
#define CLATTN_MAX_EXTENT ((int64_t)1 << 40)
/* Largest element offset a view may reach. */
#define CLATTN_MAX_OFFSET ((uint64_t)1 << 62)

static int check_dims(const char *name, const clattn_tensor *t) {
    for (int i = 0; i < 4; ++i) {
        if (t->shape[i] <= 0)
            return clattn__fail(CLATTN_ERR_INVALID_SHAPE, "%s: shape[%d] = %lld, must be > 0", name,
                                i, (long long)t->shape[i]);
        if (t->shape[i] > CLATTN_MAX_EXTENT)
            return clattn__fail(CLATTN_ERR_DEVICE_LIMIT, "%s: shape[%d] = %lld is too large", name,
                                i, (long long)t->shape[i]);
    }
    for (int i = 0; i < 4; ++i) {
        if (t->strides[i] < 0)
            return clattn__fail(CLATTN_ERR_INVALID_STRIDES,
                                "%s: strides[%d] = %lld, negative strides are not supported", name,
                                i, (long long)t->strides[i]);
        if (t->strides[i] > CLATTN_MAX_EXTENT)
            return clattn__fail(CLATTN_ERR_DEVICE_LIMIT, "%s: strides[%d] = %lld is too large",
                                name, i, (long long)t->strides[i]);
    }
    /* The last element, with every step checked: once it is below 2^62, every partial sum the
     * library and the kernels form from this view is too. */
    uint64_t last = t->offset, term;
    bool overflow = t->offset > CLATTN_MAX_OFFSET;
    for (int i = 0; i < 4 && !overflow; ++i)
        overflow =
            __builtin_mul_overflow((uint64_t)(t->shape[i] - 1), (uint64_t)t->strides[i], &term) ||
            __builtin_add_overflow(last, term, &last) || last > CLATTN_MAX_OFFSET;
    if (overflow)
        return clattn__fail(CLATTN_ERR_BUFFER_TOO_SMALL,
                            "%s: the view (offset %llu) reaches beyond 2^62 elements", name,
                            (unsigned long long)t->offset);
    return CLATTN_SUCCESS;
}

static int check_buffer(const char *name, const clattn_tensor *t, cl_context context) {
    size_t bytes = 0;
    cl_context owner = NULL;
    cl_int err = clGetMemObjectInfo(t->buffer, CL_MEM_SIZE, sizeof bytes, &bytes, NULL);
    if (err == CL_SUCCESS)
        err = clGetMemObjectInfo(t->buffer, CL_MEM_CONTEXT, sizeof owner, &owner, NULL);
    if (err != CL_SUCCESS)
        return clattn__fail(err, "%s: the buffer is not a valid cl_mem (%s)", name,
                            clattn_status_name(err));
    if (context && owner != context)
        return clattn__fail(CLATTN_ERR_CONTEXT_MISMATCH,
                            "%s: the buffer belongs to another context than the queue", name);
    uint64_t elements = bytes / clattn_dtype_size(t->dtype);
    uint64_t last = clattn__tensor_last_element(t);
    if (last >= elements)
        return clattn__fail(CLATTN_ERR_BUFFER_TOO_SMALL,
                            "%s: the view reaches element %llu (offset %llu) but the buffer holds "
                            "%llu %s elements (%zu bytes)",
                            name, (unsigned long long)last, (unsigned long long)t->offset,
                            (unsigned long long)elements, clattn_dtype_name(t->dtype), bytes);
    return CLATTN_SUCCESS;
}

int clattn__check_tensor(const char *name, const clattn_tensor *t, cl_context context,
                         unsigned dtype_mask, bool is_output) {
    if (!t)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "%s: the tensor pointer is NULL", name);
    if (!t->buffer) return clattn__fail(CLATTN_ERR_NULL_TENSOR, "%s: the buffer is NULL", name);
    if ((unsigned)t->dtype > CLATTN_U8 || !(dtype_mask & (1u << t->dtype)))
        return clattn__fail(CLATTN_ERR_UNSUPPORTED_DTYPE, "%s: dtype %s (%d) is not accepted here",
                            name, clattn_dtype_name(t->dtype), (int)t->dtype);
    int status = check_dims(name, t);
    if (status != CLATTN_SUCCESS) return status;
    if (is_output && view_overlaps_itself(t))
        return clattn__fail(
            CLATTN_ERR_INVALID_STRIDES,
            "%s: an output view must not overlap itself (strides %lld,%lld,%lld,%lld "
            "for shape %lld,%lld,%lld,%lld)",
            name, (long long)t->strides[0], (long long)t->strides[1], (long long)t->strides[2],
            (long long)t->strides[3], (long long)t->shape[0], (long long)t->shape[1],
            (long long)t->shape[2], (long long)t->shape[3]);
    return check_buffer(name, t, context);
}

int clattn__check_same_shape(const char *name_a, const clattn_tensor *a, const char *name_b,
                             const clattn_tensor *b) {
    for (int i = 0; i < 4; ++i)
        if (a->shape[i] != b->shape[i])
            return clattn__fail(
                CLATTN_ERR_SHAPE_MISMATCH,
                "%s has shape [%lld,%lld,%lld,%lld] but %s has [%lld,%lld,%lld,%lld]", name_a,
                (long long)a->shape[0], (long long)a->shape[1], (long long)a->shape[2],
                (long long)a->shape[3], name_b, (long long)b->shape[0], (long long)b->shape[1],
                (long long)b->shape[2], (long long)b->shape[3]);
    return CLATTN_SUCCESS;
}

/* The buffer a cl_mem lives in and where it starts there: a sub-buffer resolves to its parent,
 * so views through two sub-buffers of one allocation are compared in the same address space. */
static cl_mem root_buffer(cl_mem m, uint64_t *byte_offset) {
    *byte_offset = 0;
    cl_mem parent = NULL;
    size_t origin = 0;
    if (clGetMemObjectInfo(m, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL) ==
            CL_SUCCESS &&
        parent &&
        clGetMemObjectInfo(m, CL_MEM_OFFSET, sizeof origin, &origin, NULL) == CL_SUCCESS) {
        *byte_offset = origin;
        return parent;
    }
    return m;
}

int clattn__check_no_alias(const char *out_name, const clattn_tensor *out, const char *in_name,
                           const clattn_tensor *in) {
    if (!in || !out || !in->buffer || !out->buffer) return CLATTN_SUCCESS;
    uint64_t out_base, in_base;
    if (root_buffer(out->buffer, &out_base) != root_buffer(in->buffer, &in_base))
        return CLATTN_SUCCESS;
    uint64_t out_lo = out_base + out->offset * clattn_dtype_size(out->dtype);
    uint64_t out_hi =
        out_base + (clattn__tensor_last_element(out) + 1) * clattn_dtype_size(out->dtype);
    uint64_t in_lo = in_base + in->offset * clattn_dtype_size(in->dtype);
    uint64_t in_hi = in_base + (clattn__tensor_last_element(in) + 1) * clattn_dtype_size(in->dtype);
    if (out_lo < in_hi && in_lo < out_hi)
        return clattn__fail(
            CLATTN_ERR_ALIASING,
            "%s (bytes %llu..%llu) overlaps %s (bytes %llu..%llu) in the same buffer", out_name,
            (unsigned long long)out_lo, (unsigned long long)out_hi, in_name,
            (unsigned long long)in_lo, (unsigned long long)in_hi);
    return CLATTN_SUCCESS;
}

void clattn__tensor_list_add(clattn__tensor_list *list, const char *name, const clattn_tensor *t) {
    /* sized for the largest call: MHA's 14 tensors, or an op's and its mask's 5 */
    if (!t || list->count >= CLATTN__CALL_TENSORS_MAX) return;
    list->names[list->count] = name;
    list->views[list->count++] = t;
}

int clattn__check_apart(const char *out_name, const clattn_tensor *out,
                        const clattn__tensor_list *list) {
    int status = CLATTN_SUCCESS;
    /* only the output's own entry is skipped: the same descriptor passed again as an input or
     * as another output is an overlap like any other */
    for (int i = 0; i < list->count && status == CLATTN_SUCCESS; ++i)
        if (list->views[i] != out || strcmp(list->names[i], out_name) != 0)
            status = clattn__check_no_alias(out_name, out, list->names[i], list->views[i]);
    return status;
}

bool clattn__needs_wide_index(const clattn_tensor *const *views, size_t count) {
    for (size_t i = 0; i < count; ++i)
        if (views[i] && clattn__tensor_last_element(views[i]) >= clattn__narrow_index_limit())
            return true;
    return false;
}

static bool one_rows_aligned(const clattn_tensor *t, int64_t vec, size_t base_align) {
    if (base_align % ((size_t)vec * clattn_dtype_size(t->dtype)) != 0) return false;
    if (t->strides[3] != 1 && t->shape[3] > 1) return false;
    if (t->offset % (size_t)vec != 0) return false;
    for (int i = 0; i < 3; ++i)
        if (t->shape[i] > 1 && t->strides[i] % vec != 0) return false;
    return true;
}

bool clattn__rows_vector_aligned(const clattn_tensor *a, const clattn_tensor *b, int64_t vec,
                                 cl_device_id device) {
    if (vec < 2) return false;
    const size_t base = clattn__device_base_align_bytes(device);
    return one_rows_aligned(a, vec, base) && one_rows_aligned(b, vec, base);
}

int clattn__check_attention_shapes(const clattn_tensor *qt, const clattn_tensor *kt,
                                   const clattn_tensor *vt, const clattn_tensor *ot,
                                   int64_t max_head_dim) {
    const int64_t *q = qt->shape, *k = kt->shape, *v = vt->shape, *o = ot->shape;
    if (k[0] != q[0] || v[0] != q[0] || o[0] != q[0] || v[1] != k[1] || v[2] != k[2] ||
        k[3] != q[3] || o[1] != q[1] || o[2] != q[2] || o[3] != v[3])
        return clattn__fail(CLATTN_ERR_SHAPE_MISMATCH,
                            "expected q [B,Hq,Sq,D], k [B,Hkv,Sk,D], v [B,Hkv,Sk,Dv], out "
                            "[B,Hq,Sq,Dv]; got q [%lld,%lld,%lld,%lld] k [%lld,%lld,%lld,%lld] v "
                            "[%lld,%lld,%lld,%lld] out [%lld,%lld,%lld,%lld]",
                            (long long)q[0], (long long)q[1], (long long)q[2], (long long)q[3],
                            (long long)k[0], (long long)k[1], (long long)k[2], (long long)k[3],
                            (long long)v[0], (long long)v[1], (long long)v[2], (long long)v[3],
                            (long long)o[0], (long long)o[1], (long long)o[2], (long long)o[3]);
    if (q[1] % k[1] != 0)
        return clattn__fail(CLATTN_ERR_SHAPE_MISMATCH,
                            "Hq = %lld is not a multiple of Hkv = %lld (GQA groups query heads)",
                            (long long)q[1], (long long)k[1]);
    if (q[3] > (int)max_head_dim || v[3] > (int)max_head_dim)
        return clattn__fail(CLATTN_ERR_DEVICE_LIMIT, "head dims D = %lld, Dv = %lld: at most %d",
                            (long long)q[3], (long long)v[3], (int)max_head_dim);
    return CLATTN_SUCCESS;
}
