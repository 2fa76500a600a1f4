/*
 * Masked softmax over the last axis of [B,H,Sq,Sk] (forward and backward), in two variants
 * chosen by the host from device parameters, never from vendor names:
 *
 *   softmax_rows   one work-item per row, VEC-wide vector loads and math, no barriers. A CPU
 *                  (PoCL) runs each row as a tight vector loop while the row stays in cache.
 *   softmax_group  one work-group of GROUP work-items per row, strided over the keys, with
 *                  tree reductions in local memory: what a GPU wants. With ALIGNED (the host
 *                  proved every row starts VEC-aligned and Sk is a multiple of VEC) each
 *                  work-item takes VEC-key chunks with one vector access each (8 or 16 bytes),
 *                  else one key at a time. With HELD too (the row fits GROUP * HELD chunks),
 *                  each work-item keeps its chunks in registers: one read of the row.
 *
 * Both handle any row length (Sk up to INT_MAX) in three streaming passes over the keys that
 * can be visible (mask_row's [lo, hi)): the maximum, the sum of exponentials, then the output,
 * which also writes exact zeros everywhere else. Nothing is kept per row, so long rows need no
 * local memory and no second kernel. Rows that fit (HELD, SCRATCH) skip the re-reads.
 *
 * A row whose visible scores are all -inf (no visible key) is empty: its outputs are 0, or NaN
 * with EMPTY_NAN, and its log-sum-exp is -inf. A NaN or +inf visible score makes a NaN row.
 *
 * Build options: X_T, Y_T (f32|f16|bf16), LSE_T and HAS_LSE, CONTIG (the key stride of x and y
 * is 1), VEC, GROUP, ALIGNED, HELD, SCRATCH and ROWS, IDX, EMPTY_NAN, and the mask's
 * (cl/mask.cl).
 */
#ifndef CLATTN_COMMON_CL
#include "common.cl"
#endif
#ifndef CLATTN_MASK_CL
#include "mask.cl"
#endif

#ifndef X_T
#define X_T f32
#endif
#ifndef Y_T
#define Y_T f32
#endif
#ifndef LSE_T
#define LSE_T f32
#endif
#ifndef HAS_LSE
#define HAS_LSE 0
#endif
#ifndef CONTIG
#define CONTIG 1
#endif
#ifndef VEC
#define VEC 8
#endif
#ifndef GROUP
#define GROUP 64
#endif
#ifndef EMPTY_NAN
#define EMPTY_NAN 0
#endif
#ifndef ALIGNED
#define ALIGNED 0
#endif
#ifndef HELD
#define HELD 0
#endif

#define X_STORAGE CAT(storage_, X_T)
#define Y_SIZE CAT(size_, Y_T)
#define Y_STORAGE CAT(storage_, Y_T)
#define LOAD_X(i) CAT(load_, X_T)(x, i)
#define STORE_Y(i, v) CAT(store_, Y_T)(y, i, v)
#if VEC > 1
#define LOAD_XV(i) CAT(CAT(load, VEC), CAT(_, X_T))(x, i)
#define STORE_YV(i, v) CAT(CAT(store, VEC), CAT(_, Y_T))(y, i, v)
#endif

#if HAS_LSE
#define LSE_PARAMS , __global CAT(storage_, LSE_T) * lse, IDX lse_off, IDX ls0, IDX ls1, IDX ls2
#define STORE_LSE(b, h, i, v)                                                                      \
    CAT(store_, LSE_T)(lse, lse_off + (IDX)(b)*ls0 + (IDX)(h)*ls1 + (IDX)(i)*ls2, v)
#else
#define LSE_PARAMS
#define STORE_LSE(b, h, i, v) (void)0
#endif

/* The parameters both forward variants take, in this order. */
#define SOFTMAX_PARAMS                                                                             \
    __global const X_STORAGE *x, IDX x_off, IDX xs0, IDX xs1, IDX xs2, IDX xs3,                     \
        __global Y_STORAGE *y, IDX y_off, IDX ys0, IDX ys1, IDX ys2, IDX ys3, int B, int H,        \
        int Sq, int Sk LSE_PARAMS, MASK_PARAMS

/* The row's statistics after the reductions: the maximum and the sum of exp(s - max). */
typedef struct row_stats {
    float max, sum;
    int nan; /* a NaN score was seen (fmax skips NaN: softmax_rows tracks it apart,
                softmax_group finds it in the sum) */
} row_stats;

/* Empty rows have max -inf and no NaN; their outputs are `empty_value` and lse is -inf. */
inline bool row_is_empty(const row_stats *st) {
    return st->max == -INFINITY && !st->nan;
}

inline float empty_value(void) {
    return EMPTY_NAN ? NAN : 0.0f;
}

/* log-sum-exp of the visible scores: -inf for an empty row, NaN for a NaN row. */
inline float row_lse(const row_stats *st) {
    if (row_is_empty(st)) return -INFINITY;
    return st->nan ? NAN : st->max + log(st->sum);
}

/* The probability of a key with score s: exp(s - max) / sum, and exactly 0 for an invisible
 * (-inf) key even in a NaN row, where 1 / sum is NaN. */
inline float prob(float s, const row_stats *st, float inv) {
    if (row_is_empty(st)) return empty_value();
    return s == -INFINITY ? 0.0f : exp(s - st->max) * inv;
}

#if VEC > 1
inline floatV prob_vec(floatV s, const row_stats *st, float inv) {
    if (row_is_empty(st)) return (floatV)empty_value();
    return select(exp(s - st->max) * inv, (floatV)0.0f, s == (floatV)(-INFINITY));
}
#endif

/* The bits of the fill values (0 and NaN) in Y's storage type. */
#define Y_RAW CAT(raw_, Y_T)
inline uint fill_bits_f32(float v) { return as_uint(v); }
inline ushort fill_bits_bf16(float v) { return bf16_from_f32(v); }
inline ushort fill_bits_f16(float v) { return isnan(v) ? (ushort)0x7e00 : (ushort)0; }

/* y[at + k] = v for k in [0, count), key stride 1. The stores are of raw bits: PoCL 3.1
 * crashed on vstore_half8 of a constant vector (the f32 -> f16 rows case). */
inline void fill_keys(__global Y_STORAGE *y, IDX at, int count, float v) {
    __global Y_RAW *raw = (__global Y_RAW *)y;
    Y_RAW bits = CAT(fill_bits_, Y_T)(v);
    int k = 0;
#if VEC > 1
    for (; k + VEC <= count; k += VEC) CAT(vstore, VEC)((CAT(Y_RAW, VEC))bits, 0, raw + at + (IDX)k);
#endif
    for (; k < count; ++k) raw[at + (IDX)k] = bits;
}

/* ---- one work-item per row ---- */

#if VEC > 1
/* Stores VEC outputs from y[at] on. 16-bit outputs are converted in vector lanes and stored as
 * raw 16-bit scalars: PoCL 3.1 crashed (SIGSEGV) on 8- and 16-wide stores of 16-bit values at
 * addresses that are only 2-byte aligned in this kernel, though not in cl/heads.cl. */
inline void store_y_lanes(__global Y_STORAGE *y, IDX at, floatV v) {
#if Y_SIZE == 4
    STORE_YV(at, v);
#else
    CAT(ushort, VEC) bits = CAT(CAT(bits, VEC), CAT(_, Y_T))(v);
    __global ushort *raw = (__global ushort *)y + at;
    for (int k = 0; k < VEC; ++k) raw[k] = ((ushort *)&bits)[k];
#endif
}
#endif

/* The score of key j, lo <= j < hi (or keys j .. j+VEC-1): every loop stays inside [lo, hi). */
#define ROW_SCORE(j) mask_span_score(&p, &r, j, LOAD_X(xr + (IDX)(j)*xs3))
#define ROW_SCORE_VEC(j) mask_span_score_vec(&p, &r, j, LOAD_XV(xr + (IDX)(j)))

/* One exp per key instead of two: pass 2 keeps exp(s - max) in local memory, SCRATCH floats per
 * row for ROWS rows per group, and pass 3 scales it, when the row's visible span fits. Keeping it
 * in y instead would round it twice for 16-bit outputs; for f32 it measured the same, but
 * Oclgrind's uninitialized-value checker flagged the read-back (not understood; see the issue
 * notes). Everything else recomputes the exp in pass 3. */
#ifndef SCRATCH
#define SCRATCH 0
#endif
#ifndef ROWS
#define ROWS 16
#endif
#define EXP_IN_LOCAL (CONTIG && VEC > 1 && SCRATCH > 0)

__kernel void softmax_rows(SOFTMAX_PARAMS) {
#if EXP_IN_LOCAL
    __local float scratch[ROWS * SCRATCH];
#endif
    const int row = (int)get_global_id(0);
    if (row >= B * H * Sq) return;
    const int i = row % Sq, bh = row / Sq, h = bh % H, b = bh / H;
    MASK_PACK(p);
    const mask_row r = mask_row_start(&p, b, h, i, Sq, Sk);
    const IDX xr = x_off + (IDX)b * xs0 + (IDX)h * xs1 + (IDX)i * xs2;
    const IDX yr = y_off + (IDX)b * ys0 + (IDX)h * ys1 + (IDX)i * ys2;

    /* pass 1: the maximum */
    row_stats st = {-INFINITY, 0.0f, 0};
    int j = r.lo;
#if CONTIG && VEC > 1
    floatV mv = (floatV)(-INFINITY);
    intV nanv = (intV)0;
    for (; j + VEC <= r.hi; j += VEC) {
        floatV s = ROW_SCORE_VEC(j);
        mv = fmax(mv, s);
        nanv |= isnan(s);
    }
    st.max = hmax(mv);
    st.nan = any(nanv);
#endif
    for (; j < r.hi; ++j) {
        float s = ROW_SCORE(j);
        st.max = fmax(st.max, s);
        st.nan |= isnan(s);
    }

#if EXP_IN_LOCAL
    /* es[j] for j in [lo, hi) */
    __local float *es = scratch + get_local_id(0) * SCRATCH - r.lo;
    const bool keep_e = r.hi - r.lo <= SCRATCH;
#endif

    /* pass 2: the sum of exponentials (skipped for an empty row: exp(-inf - -inf) is NaN) */
    if (!row_is_empty(&st)) {
        j = r.lo;
#if CONTIG && VEC > 1
        floatV sv = (floatV)0.0f;
        for (; j + VEC <= r.hi; j += VEC) {
            floatV e = exp(ROW_SCORE_VEC(j) - st.max);
            sv += e;
#if EXP_IN_LOCAL
            if (keep_e) CAT(vstore, VEC)(e, 0, es + j);
#endif
        }
        st.sum = hsum(sv);
#endif
        for (; j < r.hi; ++j) {
            float e = exp(ROW_SCORE(j) - st.max);
            st.sum += e;
#if EXP_IN_LOCAL
            if (keep_e) es[j] = e;
#endif
        }
    }
    STORE_LSE(b, h, i, row_lse(&st));

    /* pass 3: the output, zeros outside [lo, hi) */
    const float inv = 1.0f / st.sum;
    const float outside = row_is_empty(&st) ? empty_value() : 0.0f;
#if CONTIG
    fill_keys(y, yr, r.lo, outside);
    j = r.lo;
#else
    for (j = 0; j < r.lo; ++j) STORE_Y(yr + (IDX)j * ys3, outside);
#endif
#if EXP_IN_LOCAL
    if (keep_e && !row_is_empty(&st) && !isnan(st.sum)) {
        for (; j + VEC <= r.hi; j += VEC)
            store_y_lanes(y, yr + (IDX)j, CAT(vload, VEC)(0, es + j) * inv);
        for (; j < r.hi; ++j) STORE_Y(yr + (IDX)j, es[j] * inv);
    }
#endif
#if CONTIG && VEC > 1
    for (; j + VEC <= r.hi; j += VEC)
        store_y_lanes(y, yr + (IDX)j, prob_vec(ROW_SCORE_VEC(j), &st, inv));
#endif
    for (; j < r.hi; ++j) STORE_Y(yr + (IDX)j * ys3, prob(ROW_SCORE(j), &st, inv));
#if CONTIG
    fill_keys(y, yr + (IDX)j, Sk - j, outside);
#else
    for (; j < Sk; ++j) STORE_Y(yr + (IDX)j * ys3, outside);
#endif
}

/* ---- one work-group per row ---- */

/* Tree reductions over the group in local memory; every work-item gets the result. */
inline float group_max(__local float *scratch, float v) {
    const int lid = (int)get_local_id(0);
    scratch[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int step = GROUP / 2; step > 0; step /= 2) {
        if (lid < step) scratch[lid] = fmax(scratch[lid], scratch[lid + step]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float result = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE); /* scratch is reused by the next reduction */
    return result;
}

inline float group_sum(__local float *scratch, float v) {
    const int lid = (int)get_local_id(0);
    scratch[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int step = GROUP / 2; step > 0; step /= 2) {
        if (lid < step) scratch[lid] += scratch[lid + step];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float result = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return result;
}

/* The row's statistics from the group's max and sum of exp(s - base), base the max or, for a
 * max of -inf, 0 (so that the -inf scores add 0 and a NaN among them still adds NaN): a NaN
 * score, or a +inf one (exp(inf - inf)), makes the sum NaN, which is how softmax_group finds a
 * NaN row, one reduction fewer than tracking NaN apart. */
inline float group_base(float max) {
    return max == -INFINITY ? 0.0f : max;
}
inline row_stats group_stats(float max, float sum) {
    row_stats st = {max, sum, isnan(sum)};
    return st;
}

/* softmax_group's passes over the keys. Pass 1 and 2 give the row's statistics (every
 * work-item gets them), pass 3 stores the row: y at the keys of [lo, hi), `outside` elsewhere.
 * With ALIGNED a work-item takes whole VEC-key chunks, one vector access each: the chunks that
 * hold keys of [lo, hi) in passes 1 and 2, every chunk of the row in pass 3. A chunk's lanes
 * outside [lo, hi) are keys of the same row, which mask_score_vec hides (-inf: exp gives 0). */
#define GROUP_VECTORS (ALIGNED && CONTIG && VEC >= 4)
/* The t-th chunk a work-item holds (HELD), and whether the row has it */
#define HELD_CHUNK(t) ((int)get_local_id(0) + (t)*GROUP)
#define HELD_IN_ROW(t) (HELD_CHUNK(t) < Sk / VEC)
#if HELD > 0 && !GROUP_VECTORS
#error "HELD needs ALIGNED, CONTIG and VEC >= 4 (the host sets it only for aligned rows)"
#endif
#if GROUP_VECTORS
#define LOAD_XA(j) CAT(CAT(load_aligned, VEC), CAT(_, X_T))(x, xr + (IDX)(j))
#define SCORE_XA(j) mask_score_vec(p, r, j, LOAD_XA(j))
#define STORE_YA(j, v) CAT(CAT(store_aligned, VEC), CAT(_, Y_T))(y, yr + (IDX)(j), v)

/* The chunks [first, last) hold the keys of [lo, hi). */
inline int first_chunk(const mask_row *r) {
    return r->lo / VEC;
}
inline int last_chunk(const mask_row *r) {
    return r->hi > r->lo ? (r->hi + VEC - 1) / VEC : r->lo / VEC;
}

inline row_stats group_row_stats(__global const X_STORAGE *x, IDX xr, __local float *scratch,
                                 const mask_params *p, const mask_row *r) {
    const int lid = (int)get_local_id(0), first = first_chunk(r), last = last_chunk(r);
    floatV m = (floatV)(-INFINITY);
    for (int c = first + lid; c < last; c += GROUP) m = fmax(m, SCORE_XA(c * VEC));
    const float max = group_max(scratch, hmax(m)), base = group_base(max);
    floatV sum = (floatV)0.0f;
    for (int c = first + lid; c < last; c += GROUP) sum += exp(SCORE_XA(c * VEC) - base);
    return group_stats(max, group_sum(scratch, hsum(sum)));
}

inline void group_store_row(__global const X_STORAGE *x, IDX xr, __global Y_STORAGE *y, IDX yr,
                            int Sk, const mask_params *p, const mask_row *r, const row_stats *st,
                            float inv, float outside) {
    const int lid = (int)get_local_id(0), first = first_chunk(r), last = last_chunk(r);
    for (int c = lid; c < Sk / VEC; c += GROUP) {
        floatV v = c < first || c >= last ? (floatV)outside : prob_vec(SCORE_XA(c * VEC), st, inv);
        STORE_YA(c * VEC, v);
    }
}

/* HELD > 0 (the host proved the row's Sk / VEC chunks fit GROUP * HELD): one read and one
 * exponential a key. A work-item holds chunks c = lid + t * GROUP (t < HELD) in registers from
 * the load to the store, exponentials in place of scores once the max is known; the two passes
 * above read each key twice more and take two exponentials. An invisible key's exponential is
 * held as -0.0f, which exp never returns, so the store tells it apart without keeping the score:
 * 0 even in a NaN row, where 1 / sum is NaN (as prob_vec). The held array stays in the kernel:
 * passed to a helper that a compiler keeps as a call, it would live on the stack (clang's PTX). */
#if HELD > 0
/* The scores of this work-item's chunk t, -inf outside the chunks that hold [lo, hi). */
inline floatV held_scores(__global const X_STORAGE *x, IDX xr, const mask_params *p,
                          const mask_row *r, int t) {
    const int c = HELD_CHUNK(t);
    return c >= first_chunk(r) && c < last_chunk(r) ? SCORE_XA(c * VEC) : (floatV)(-INFINITY);
}

inline floatV held_exp(floatV s, float base) {
    return select(exp(s - base), (floatV)(-0.0f), s == (floatV)(-INFINITY));
}

/* Chunks outside [first, last) hold -0.0f: they get `outside`. */
inline floatV held_prob(floatV e, const row_stats *st, float inv) {
    if (row_is_empty(st)) return (floatV)empty_value();
    return select(e * inv, (floatV)0.0f, CAT(as_int, VEC)(e) == (intV)INT_MIN);
}
#endif
#else
/* key j, lo <= j < hi */
#define SCORE_X(j) mask_span_score(p, r, j, LOAD_X(xr + (IDX)(j)*xs3))

inline row_stats group_row_stats(__global const X_STORAGE *x, IDX xr, IDX xs3,
                                 __local float *scratch, const mask_params *p,
                                 const mask_row *r) {
    const int lid = (int)get_local_id(0);
    float m = -INFINITY;
    for (int j = r->lo + lid; j < r->hi; j += GROUP) m = fmax(m, SCORE_X(j));
    const float max = group_max(scratch, m), base = group_base(max);
    float sum = 0.0f;
    for (int j = r->lo + lid; j < r->hi; j += GROUP) sum += exp(SCORE_X(j) - base);
    return group_stats(max, group_sum(scratch, sum));
}

inline void group_store_row(__global const X_STORAGE *x, IDX xr, IDX xs3, __global Y_STORAGE *y,
                            IDX yr, IDX ys3, int Sk, const mask_params *p, const mask_row *r,
                            const row_stats *st, float inv, float outside) {
    for (int j = (int)get_local_id(0); j < Sk; j += GROUP) {
        float v = j < r->lo || j >= r->hi ? outside : prob(SCORE_X(j), st, inv);
        STORE_Y(yr + (IDX)j * ys3, v);
    }
}
#endif

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1))) void softmax_group(SOFTMAX_PARAMS) {
    __local float scratch[GROUP];
    const int row = (int)get_group_id(0);
    const int i = row % Sq, bh = row / Sq, h = bh % H, b = bh / H;
    MASK_PACK(p);
    const mask_row r = mask_row_start(&p, b, h, i, Sq, Sk);
    const IDX xr = x_off + (IDX)b * xs0 + (IDX)h * xs1 + (IDX)i * xs2;
    const IDX yr = y_off + (IDX)b * ys0 + (IDX)h * ys1 + (IDX)i * ys2;
#if HELD > 0
    floatV e[HELD], m = (floatV)(-INFINITY), sum = (floatV)0.0f;
    UNROLL for (int t = 0; t < HELD; ++t) m = fmax(m, e[t] = held_scores(x, xr, &p, &r, t));
    const float max = group_max(scratch, hmax(m)), base = group_base(max);
    UNROLL for (int t = 0; t < HELD; ++t) sum += e[t] = held_exp(e[t], base);
    const row_stats st = group_stats(max, group_sum(scratch, hsum(sum)));
#elif GROUP_VECTORS
    const row_stats st = group_row_stats(x, xr, scratch, &p, &r);
#else
    const row_stats st = group_row_stats(x, xr, xs3, scratch, &p, &r);
#endif
    if (get_local_id(0) == 0) STORE_LSE(b, h, i, row_lse(&st));

    const float inv = 1.0f / st.sum;
    /* in place (y over x), a key read above by one work-item (from r.lo) may be written below
     * by another (from 0): the reductions' barriers fence local memory only */
    barrier(CLK_GLOBAL_MEM_FENCE);
#if HELD > 0
    UNROLL for (int t = 0; t < HELD; ++t)
        if (HELD_IN_ROW(t)) STORE_YA(HELD_CHUNK(t) * VEC, held_prob(e[t], &st, inv));
#else
    const float outside = row_is_empty(&st) ? empty_value() : 0.0f;
#if GROUP_VECTORS
    group_store_row(x, xr, y, yr, Sk, &p, &r, &st, inv, outside);
#else
    group_store_row(x, xr, xs3, y, yr, ys3, Sk, &p, &r, &st, inv, outside);
#endif
#endif
}

/* ---- backward: dz = scale * y * (dy - sum_j dy_j * y_j), 0 where y is 0 ---- */

#ifndef DY_T
#define DY_T f32
#endif
#ifndef DZ_T
#define DZ_T f32
#endif

#define BACKWARD_PARAMS                                                                            \
    __global const Y_STORAGE *y, IDX y_off, IDX ys0, IDX ys1, IDX ys2, IDX ys3,                     \
        __global const CAT(storage_, DY_T) * dy, IDX dy_off, IDX ds0, IDX ds1, IDX ds2, IDX ds3,    \
        __global CAT(storage_, DZ_T) * dz, IDX dz_off, IDX zs0, IDX zs1, IDX zs2, IDX zs3, int B,  \
        int H, int Sq, int Sk, float scale

/* Where y is 0 (masked or underflowed) the term and the gradient are 0, so whatever dy holds
 * there (NaN, Inf) never reaches the result. */
inline float grad_term(float yv, float dyv) {
    return yv == 0.0f ? 0.0f : yv * dyv;
}

inline float grad_value(float yv, float dyv, float dot, float scale) {
    return yv == 0.0f ? 0.0f : scale * yv * (dyv - dot);
}

#define BACKWARD_ROW_START(row)                                                                    \
    const int i = (row) % Sq, bh = (row) / Sq, h = bh % H, b = bh / H;                             \
    const IDX yr = y_off + (IDX)b * ys0 + (IDX)h * ys1 + (IDX)i * ys2;                             \
    const IDX dr = dy_off + (IDX)b * ds0 + (IDX)h * ds1 + (IDX)i * ds2;                            \
    const IDX zr = dz_off + (IDX)b * zs0 + (IDX)h * zs1 + (IDX)i * zs2
#define Y_AT(j) CAT(load_, Y_T)(y, yr + (IDX)(j) * ys3)
#define DY_AT(j) CAT(load_, DY_T)(dy, dr + (IDX)(j) * ds3)
#define STORE_DZ(j, v) CAT(store_, DZ_T)(dz, zr + (IDX)(j) * zs3, v)

__kernel void softmax_backward_rows(BACKWARD_PARAMS) {
    const int row = (int)get_global_id(0);
    if (row >= B * H * Sq) return;
    BACKWARD_ROW_START(row);
    float dot = 0.0f;
    for (int j = 0; j < Sk; ++j) dot += grad_term(Y_AT(j), DY_AT(j));
    for (int j = 0; j < Sk; ++j) STORE_DZ(j, grad_value(Y_AT(j), DY_AT(j), dot, scale));
}

/* With ALIGNED (every row of y, dy and dz starts VEC-aligned, Sk a multiple of VEC) the group
 * variant takes VEC-key chunks, one vector access each, and with HELD keeps them in registers
 * (y and dy read once), as the forward group variant does. */
#if GROUP_VECTORS
#define Y_ATV(c) CAT(CAT(load_aligned, VEC), CAT(_, Y_T))(y, yr + (IDX)(c)*VEC)
#define DY_ATV(c) CAT(CAT(load_aligned, VEC), CAT(_, DY_T))(dy, dr + (IDX)(c)*VEC)
#define STORE_DZV(c, v) CAT(CAT(store_aligned, VEC), CAT(_, DZ_T))(dz, zr + (IDX)(c)*VEC, v)

inline floatV grad_term_vec(floatV yv, floatV dyv) {
    return select(yv * dyv, (floatV)0.0f, yv == (floatV)0.0f);
}

inline floatV grad_value_vec(floatV yv, floatV dyv, float dot, float scale) {
    return select(scale * yv * (dyv - dot), (floatV)0.0f, yv == (floatV)0.0f);
}
#endif

__kernel __attribute__((reqd_work_group_size(GROUP, 1, 1))) void
softmax_backward_group(BACKWARD_PARAMS) {
    __local float scratch[GROUP];
    BACKWARD_ROW_START((int)get_group_id(0));
#if GROUP_VECTORS && HELD > 0
    floatV yh[HELD], dyh[HELD], part = (floatV)0.0f;
    UNROLL for (int t = 0; t < HELD; ++t) {
        yh[t] = HELD_IN_ROW(t) ? Y_ATV(HELD_CHUNK(t)) : (floatV)0.0f;
        dyh[t] = HELD_IN_ROW(t) ? DY_ATV(HELD_CHUNK(t)) : (floatV)0.0f;
        part += grad_term_vec(yh[t], dyh[t]);
    }
    const float dot = group_sum(scratch, hsum(part));
    UNROLL for (int t = 0; t < HELD; ++t)
        if (HELD_IN_ROW(t)) STORE_DZV(HELD_CHUNK(t), grad_value_vec(yh[t], dyh[t], dot, scale));
#elif GROUP_VECTORS
    const int lid = (int)get_local_id(0);
    floatV part = (floatV)0.0f;
    for (int c = lid; c < Sk / VEC; c += GROUP) part += grad_term_vec(Y_ATV(c), DY_ATV(c));
    const float dot = group_sum(scratch, hsum(part));
    for (int c = lid; c < Sk / VEC; c += GROUP)
        STORE_DZV(c, grad_value_vec(Y_ATV(c), DY_ATV(c), dot, scale));
#else
    const int lid = (int)get_local_id(0);
    float part = 0.0f;
    for (int j = lid; j < Sk; j += GROUP) part += grad_term(Y_AT(j), DY_AT(j));
    const float dot = group_sum(scratch, part);
    for (int j = lid; j < Sk; j += GROUP) STORE_DZ(j, grad_value(Y_AT(j), DY_AT(j), dot, scale));
#endif
}
