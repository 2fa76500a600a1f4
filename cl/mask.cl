/*
 * The mask algebra of docs/design.md, built inside the kernel from its parts; no
 * dense mask is ever materialized. Shared by softmax, attention and linear attention: an op
 * declares MASK_PARAMS after its own kernel parameters (the host sets them in this order, see
 * src/ops/mask.c), packs them with MASK_PACK, then asks per row and per key:
 *
 *   s = scale * x
 *   if softcap > 0:  s = softcap * tanh(s / softcap)
 *   s += bias[b,h,i,j]                        (HAS_BIAS)
 *   s -= slope[h] * |pos - j|                 (HAS_ALIBI), pos = i + off
 *   visible = j < end && (window_ok || global_ok) && keep[b,h,i,j] != 0
 *     end       = key_len[b], and pos + 1 when causal; 0 for a row i >= query_len[b]
 *     off       = 0 (top-left) or key_len[b] - query_len[b] (bottom-right)
 *     window_ok = pos - left <= j <= pos + right  (left/right < 0: unbounded on that side)
 *     global_ok = global_stride > 0 && (j % global_stride == 0 || pos % global_stride == 0)
 *   score = visible ? s : -INFINITY
 *
 * The score is selected last, so a NaN, Inf or 1e30 in x, bias or anything else at an invisible
 * position never reaches the result. Lengths are clamped to [0, Sq] and [0, Sk].
 *
 * Build options (defaults below): HAS_KLEN, HAS_QLEN, HAS_KEEP, HAS_BIAS (BIAS_T), HAS_ALIBI
 * (ALIBI_T), HAS_SOFTCAP, HAS_GLOBAL. Causality and the window are plain int parameters: they
 * only move the bounds of a row.
 */
#ifndef CLATTN_MASK_CL
#define CLATTN_MASK_CL

#ifndef CLATTN_COMMON_CL
#include "common.cl"
#endif

#ifndef HAS_KLEN
#define HAS_KLEN 0
#endif
#ifndef HAS_QLEN
#define HAS_QLEN 0
#endif
#ifndef HAS_KEEP
#define HAS_KEEP 0
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef BIAS_T
#define BIAS_T f32
#endif
#ifndef HAS_ALIBI
#define HAS_ALIBI 0
#endif
#ifndef ALIBI_T
#define ALIBI_T f32
#endif
#ifndef HAS_SOFTCAP
#define HAS_SOFTCAP 0
#endif
#ifndef HAS_GLOBAL
#define HAS_GLOBAL 0
#endif

#if HAS_KLEN
#define KLEN_PARAMS , __global const int *klen, IDX klen_off, IDX klen_s
#else
#define KLEN_PARAMS
#endif
#if HAS_QLEN
#define QLEN_PARAMS , __global const int *qlen, IDX qlen_off, IDX qlen_s
#else
#define QLEN_PARAMS
#endif
#if HAS_KEEP
#define KEEP_PARAMS                                                                                \
    , __global const uchar *keep, IDX keep_off, IDX keep_s0, IDX keep_s1, IDX keep_s2, IDX keep_s3
#else
#define KEEP_PARAMS
#endif
#if HAS_BIAS
#define BIAS_STORAGE CAT(storage_, BIAS_T)
#define BIAS_PARAMS                                                                                \
    , __global const BIAS_STORAGE *bias, IDX bias_off, IDX bias_s0, IDX bias_s1, IDX bias_s2,      \
        IDX bias_s3
#else
#define BIAS_PARAMS
#endif
#if HAS_ALIBI
#define ALIBI_PARAMS , __global const CAT(storage_, ALIBI_T) *alibi, IDX alibi_off, IDX alibi_s
#else
#define ALIBI_PARAMS
#endif

/* Every op's kernel ends its parameter list with these. */
#define MASK_PARAMS                                                                                \
    float scale, float softcap, int causal, int align_bottom, int win_left, int win_right,          \
        int global_stride KLEN_PARAMS QLEN_PARAMS KEEP_PARAMS BIAS_PARAMS ALIBI_PARAMS

typedef struct mask_params {
    float scale, softcap;
    int causal, align_bottom, win_left, win_right, global_stride;
#if HAS_KLEN
    __global const int *klen;
    IDX klen_off, klen_s;
#endif
#if HAS_QLEN
    __global const int *qlen;
    IDX qlen_off, qlen_s;
#endif
#if HAS_KEEP
    __global const uchar *keep;
    IDX keep_off, keep_s0, keep_s1, keep_s2, keep_s3;
#endif
#if HAS_BIAS
    __global const BIAS_STORAGE *bias;
    IDX bias_off, bias_s0, bias_s1, bias_s2, bias_s3;
#endif
#if HAS_ALIBI
    __global const CAT(storage_, ALIBI_T) * alibi;
    IDX alibi_off, alibi_s;
#endif
} mask_params;

#if HAS_KLEN
#define MASK_PACK_KLEN(p) p.klen = klen, p.klen_off = klen_off, p.klen_s = klen_s
#else
#define MASK_PACK_KLEN(p) (void)0
#endif
#if HAS_QLEN
#define MASK_PACK_QLEN(p) p.qlen = qlen, p.qlen_off = qlen_off, p.qlen_s = qlen_s
#else
#define MASK_PACK_QLEN(p) (void)0
#endif
#if HAS_KEEP
#define MASK_PACK_KEEP(p)                                                                          \
    p.keep = keep, p.keep_off = keep_off, p.keep_s0 = keep_s0, p.keep_s1 = keep_s1,                 \
    p.keep_s2 = keep_s2, p.keep_s3 = keep_s3
#else
#define MASK_PACK_KEEP(p) (void)0
#endif
#if HAS_BIAS
#define MASK_PACK_BIAS(p)                                                                          \
    p.bias = bias, p.bias_off = bias_off, p.bias_s0 = bias_s0, p.bias_s1 = bias_s1,                 \
    p.bias_s2 = bias_s2, p.bias_s3 = bias_s3
#else
#define MASK_PACK_BIAS(p) (void)0
#endif
#if HAS_ALIBI
#define MASK_PACK_ALIBI(p) p.alibi = alibi, p.alibi_off = alibi_off, p.alibi_s = alibi_s
#else
#define MASK_PACK_ALIBI(p) (void)0
#endif

/* Declares `mask_params p` filled from the MASK_PARAMS of the enclosing kernel. */
#define MASK_PACK(p)                                                                               \
    mask_params p;                                                                                 \
    p.scale = scale, p.softcap = softcap, p.causal = causal, p.align_bottom = align_bottom,        \
    p.win_left = win_left, p.win_right = win_right, p.global_stride = global_stride;               \
    MASK_PACK_KLEN(p);                                                                             \
    MASK_PACK_QLEN(p);                                                                             \
    MASK_PACK_KEEP(p);                                                                             \
    MASK_PACK_BIAS(p);                                                                             \
    MASK_PACK_ALIBI(p)

/* One query row's view of the mask. */
typedef struct mask_row {
    int pos;        /* i + off: the query's position on the key axis */
    int start;      /* keys before start are hidden (0, or a key split's first key) */
    int end;        /* keys [start, end) pass the lengths and causality */
    int wlo, whi;   /* the window [wlo, whi], clamped to the row */
    int lo, hi;     /* no key outside [lo, hi) can be visible */
    int row_global; /* every key in [0, end) is in the window (a global query) */
    float slope;    /* ALiBi slope of the head */
#if HAS_KEEP
    IDX keep_row;
#endif
#if HAS_BIAS
    IDX bias_row;
#endif
} mask_row;

/* Batch b's key length, clamped to [0, Sk]: no query of the batch sees a key past it. */
inline int mask_key_length(const mask_params *p, int b, int Sk) {
#if HAS_KLEN
    return clamp(p->klen[p->klen_off + (IDX)b * p->klen_s], 0, Sk);
#else
    return Sk;
#endif
}

inline mask_row mask_row_start(const mask_params *p, int b, int h, int i, int Sq, int Sk) {
    mask_row r;
    int klen_b = mask_key_length(p, b, Sk), qlen_b = Sq;
#if HAS_QLEN
    qlen_b = clamp(p->qlen[p->qlen_off + (IDX)b * p->qlen_s], 0, Sq);
#endif
    r.pos = p->align_bottom ? i + klen_b - qlen_b : i;
    r.start = 0;
    r.end = klen_b;
    if (p->causal) r.end = clamp(r.pos + 1, 0, r.end);
    if (i >= qlen_b) r.end = 0;
    /* in long: pos - left and pos + right may leave the int range before the clamp */
    r.wlo = p->win_left < 0 ? 0 : (int)clamp((long)r.pos - p->win_left, 0L, (long)Sk);
    r.whi = p->win_right < 0 ? Sk - 1 : (int)clamp((long)r.pos + p->win_right, -1L, (long)Sk - 1);
    r.row_global = 0;
#if HAS_GLOBAL
    r.row_global = r.pos % p->global_stride == 0;
#endif
    r.lo = r.row_global || HAS_GLOBAL ? 0 : r.wlo;
    r.hi = r.row_global || HAS_GLOBAL ? r.end : min(r.end, r.whi + 1);
    if (r.row_global) r.wlo = 0, r.whi = Sk - 1;
    r.slope = 0.0f;
#if HAS_ALIBI
    r.slope = CAT(load_, ALIBI_T)(p->alibi, p->alibi_off + (IDX)h * p->alibi_s);
#endif
#if HAS_KEEP
    r.keep_row = p->keep_off + (IDX)b * p->keep_s0 + (IDX)h * p->keep_s1 + (IDX)i * p->keep_s2;
#endif
#if HAS_BIAS
    r.bias_row = p->bias_off + (IDX)b * p->bias_s0 + (IDX)h * p->bias_s1 + (IDX)i * p->bias_s2;
#endif
    return r;
}

/* Hides every key outside [first, last): a work-item that takes one split of the keys. */
inline void mask_row_clip(mask_row *r, int first, int last) {
    r->start = max(r->start, first);
    r->end = min(r->end, last);
    r->lo = max(r->lo, first);
    r->hi = max(r->lo, min(r->hi, last));
}

/* (Here, beside group_key_span, since the attention's kernels and the backward's, which include
 * this file, both place their groups so.)
 * Where work-group `unit` of a launch of heads x blocks (query blocks of each (batch, head))
 * works: (batch-head, block). order 0: a head's blocks in turn. order n > 0, for causal masks,
 * where a head's last block sees the most keys: longest first (a GPU starts groups in order, so
 * the last to start, which set the launch's tail, are then the lightest), blocks from the last,
 * each across n heads (a section) before the next, so that the heads whose keys a section reads
 * are few enough to stay in the cache (the host sizes n); the last section takes the heads left. */
inline int2 unit_place(int unit, int blocks, int heads, int order) {
    if (order <= 0) return (int2)(unit / blocks, unit % blocks);
    const int section = unit / (order * blocks), within = unit % (order * blocks);
    const int width = min(order, heads - section * order);
    return (int2)(section * order + within % width, blocks - 1 - within / width);
}

/* The first and the end of the keys any query of the work-group can see, from each work-item's
 * [lo, hi) (empty when lo >= hi): a tile no query sees is never loaded. Its barriers also
 * publish what the group wrote to local memory before it. */
inline int2 group_key_span(__local int *span, int lo, int hi, int Sk) {
    if (get_local_id(0) == 0) span[0] = Sk, span[1] = 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lo < hi) {
        atomic_min(&span[0], lo);
        atomic_max(&span[1], hi);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return (int2)(span[0], span[1]);
}

/* The keys [x, y) that are all visible to the row and whose scores the mask changes by nothing
 * but the scale (empty, x >= y, under a keep mask, bias, ALiBi or softcap): mask_score(p, r, j,
 * s) is p->scale * s for each of them. A key visible only as a global position does not count
 * (fewer keys are always safe). */
inline int2 mask_plain_keys(const mask_row *r) {
#if HAS_KEEP || HAS_BIAS || HAS_ALIBI || HAS_SOFTCAP
    return (int2)(0, 0);
#else
    return (int2)(max(max(r->lo, r->start), r->wlo), min(min(r->hi, r->end), r->whi + 1));
#endif
}

/* Without a keep mask or global positions every key of [lo, hi) is visible: causality, the
 * lengths, the window and a key split all narrow [lo, hi) itself (mask_row_start,
 * mask_row_clip). A kernel that stays inside [lo, hi) then scores with mask_span_score(_vec),
 * which skips the per-key visibility test (on PoCL the test and its select halved softmax_rows). */
#define MASK_SPAN_ALL_VISIBLE (!HAS_KEEP && !HAS_GLOBAL)

/* The logit of key j given its raw value x, before visibility: scale, softcap, bias, ALiBi. */
inline float mask_logit(const mask_params *p, const mask_row *r, int j, float x) {
    float s = p->scale * x;
#if HAS_SOFTCAP
    s = p->softcap * tanh(s / p->softcap);
#endif
#if HAS_BIAS
    s += CAT(load_, BIAS_T)(p->bias, r->bias_row + (IDX)j * p->bias_s3);
#endif
#if HAS_ALIBI
    s -= r->slope * fabs((float)(r->pos - j));
#endif
    return s;
}

/* The score of key j (lo <= j < hi) given its raw value x: the masked logit, or -INFINITY. */
inline float mask_score(const mask_params *p, const mask_row *r, int j, float x) {
    const float s = mask_logit(p, r, j, x);
    int visible = j < r->end && j >= r->start;
    int in_window = j >= r->wlo && j <= r->whi;
#if HAS_GLOBAL
    in_window = in_window || j % p->global_stride == 0;
#endif
    visible = visible && in_window;
#if HAS_KEEP
    visible = visible && p->keep[r->keep_row + (IDX)j * p->keep_s3] != 0;
#endif
    return visible ? s : -INFINITY;
}

/* mask_score for a key of [lo, hi), by a kernel whose loop stays there: the logit alone when
 * every key of the span is visible. */
inline float mask_span_score(const mask_params *p, const mask_row *r, int j, float x) {
#if MASK_SPAN_ALL_VISIBLE
    return mask_logit(p, r, j, x);
#else
    return mask_score(p, r, j, x);
#endif
}

#if defined(VEC) && VEC > 1
#define intV CAT(int, VEC)
#define ucharV CAT(uchar, VEC)

/* The lane offsets 0, 1, ..., VEC-1. */
inline intV lane_ids(void) {
#if VEC == 2
    return (intV)(0, 1);
#elif VEC == 4
    return (intV)(0, 1, 2, 3);
#elif VEC == 8
    return (intV)(0, 1, 2, 3, 4, 5, 6, 7);
#else
    return (intV)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#endif
}

#if HAS_BIAS
inline floatV mask_bias_vec(const mask_params *p, const mask_row *r, int j) {
    IDX at = r->bias_row + (IDX)j * p->bias_s3;
    if (p->bias_s3 == 1) return CAT(CAT(load, VEC), CAT(_, BIAS_T))(p->bias, at);
    if (p->bias_s3 == 0) return (floatV)CAT(load_, BIAS_T)(p->bias, at);
    float lanes[VEC];
    for (int k = 0; k < VEC; ++k) lanes[k] = CAT(load_, BIAS_T)(p->bias, at + (IDX)k * p->bias_s3);
    return CAT(vload, VEC)(0, lanes);
}
#endif

#if HAS_KEEP
inline intV mask_keep_vec(const mask_params *p, const mask_row *r, int j) {
    IDX at = r->keep_row + (IDX)j * p->keep_s3;
    ucharV k;
    if (p->keep_s3 == 1) {
        k = CAT(vload, VEC)(0, p->keep + at);
    } else {
        uchar lanes[VEC];
        for (int q = 0; q < VEC; ++q) lanes[q] = p->keep[at + (IDX)q * p->keep_s3];
        k = CAT(vload, VEC)(0, lanes);
    }
    return CAT(convert_int, VEC)(k) != (intV)0;
}
#endif

/* mask_logit for keys j .. j+VEC-1. */
inline floatV mask_logit_vec(const mask_params *p, const mask_row *r, int j, floatV x) {
    floatV s = p->scale * x;
#if HAS_SOFTCAP
    s = p->softcap * tanh(s / p->softcap);
#endif
#if HAS_BIAS
    s += mask_bias_vec(p, r, j);
#endif
#if HAS_ALIBI
    s -= r->slope * fabs(CAT(convert_float, VEC)((intV)r->pos - ((intV)j + lane_ids())));
#endif
    return s;
}

/* mask_score for keys j .. j+VEC-1 of the row (inside [0, Sk)); keys outside [lo, hi) are hidden
 * like any other, so a chunk may straddle lo or hi. */
inline floatV mask_score_vec(const mask_params *p, const mask_row *r, int j, floatV x) {
    const floatV s = mask_logit_vec(p, r, j, x);
    const intV jv = (intV)j + lane_ids();
    intV visible = jv < (intV)r->end & jv >= (intV)r->start;
    intV in_window = jv >= (intV)r->wlo & jv <= (intV)r->whi;
#if HAS_GLOBAL
    in_window |= jv % (intV)p->global_stride == (intV)0;
#endif
    visible &= in_window;
#if HAS_KEEP
    visible &= mask_keep_vec(p, r, j);
#endif
    return select((floatV)(-INFINITY), s, visible);
}

/* mask_span_score for keys j .. j+VEC-1, all of [lo, hi). */
inline floatV mask_span_score_vec(const mask_params *p, const mask_row *r, int j, floatV x) {
#if MASK_SPAN_ALL_VISIBLE
    return mask_logit_vec(p, r, j, x);
#else
    return mask_score_vec(p, r, j, x);
#endif
}

/* mask_score_vec for a chunk of keys held in registers (dots) that may straddle lo or hi: a
 * chunk inside [lo, hi) takes mask_span_score_vec (on PoCL that took a sixth off decoding's
 * attention_blocks). */
inline floatV mask_chunk_score(const mask_params *p, const mask_row *r, int j, floatV x) {
    if (j >= r->lo && j + VEC <= r->hi) return mask_span_score_vec(p, r, j, x);
    return mask_score_vec(p, r, j, x);
}
#endif /* VEC > 1 */

#endif /* CLATTN_MASK_CL */
