/*
 * The gradients of linear attention (cl/linear_attention.cl). With phi the feature map, the
 * visible keys of query i a prefix of the keys (causal) or all of them, S_i = sum_j phi(k_j)
 * v_j^T, z_i = sum_j phi(k_j), num_i = S_i^T phi(q_i), den_i = phi(q_i) . z_i + eps and
 * out_i = num_i / den_i, given dO_i:
 *
 *   dnum_i = dO_i / den_i          dden_i = -(dO_i . num_i) / den_i^2
 *   dq_i   = phi'(q_i) o (S_i dnum_i + z_i dden_i)
 *   dv_j   = R_j^T phi(k_j)        dk_j = phi'(k_j) o (R_j v_j + r_j)
 *   R_j    = sum_i phi(q_i) dnum_i^T,   r_j = sum_i phi(q_i) dden_i   over the queries that see j
 *
 * The queries that see key j are a suffix of the queries (causal: i >= j - off, below the query
 * length) or all of them: R_j and r_j are running sums from the end, the forward's scan in
 * reverse. A query that sees no key adds nothing and gets dq 0; a key no query sees gets 0.
 *
 * The forward's own kernels (linear_features, linear_states, linear_scan) first leave phi(k)
 * and the key-chunk states S, z in the scratch. Then:
 *
 *   linear_transpose_states  S^T of each state the next kernel reads (TSLOT floats a slot), so
 *                       that S dnum, as S^T phi(q), is a broadcast-and-FMA per element of the
 *                       vector it multiplies, not a dot with a horizontal sum per element of
 *                       the result.
 *   linear_query_grads  a work-item per BM queries of one (batch, query head): num and den as
 *                       the forward computes them, then dq; and each query's terms (phi(q_i),
 *                       dnum_i, dden_i: TERM floats) into scratch, zeros for a query that sees
 *                       no key.
 *   linear_term_states  a work-item per ROWS rows of one chunk of queries of one (batch, kv
 *                       head): the chunk's sums of phi(q) dnum^T and phi(q) dden over the query
 *                       heads of the kv head (in slot c, SLOT floats as the forward's states).
 *   linear_term_scan    a work-item per VEC lanes of a state row: slot c becomes the sum of the
 *                       chunks from c to the end (slot qchunks: zero), in reverse order.
 *   linear_transpose_states  again, for R^T.
 *   linear_key_grads    a work-item per BM keys of one (batch, kv head): R, r from the slot of
 *                       the first whole query chunk every key of the block is seen by, plus the
 *                       queries before it one by one, each key from its own first query; then
 *                       dv and dk.
 *
 * Build options: those of cl/linear_attention.cl (FEATURE, CAUSAL, HEAD_DIM, VALUE_DIM, VEC,
 * ROWS, BM, IDX, the mask's), and DO_T, DQ_T, DK_T, DV_T.
 */
/* The forward's file comes first (the host builds this one after it): the feature map, SLOT,
 * the private-row macros and the build options' defaults. */
#ifndef CLATTN_LINEAR_ATTENTION_CL
#include "linear_attention.cl"
#endif

/* A query's terms: phi(q_i) [HEAD_DIM], dnum_i [VALUE_DIM], dden_i. */
#define TERM (HEAD_DIM + VALUE_DIM + 1)
/* A transposed state: S^T alone. The transposes keep every slot of a head when causal, else
 * the one slot the gradients read (the key states' total, the query states' sum over all): the
 * offset of head bh's slot `slot` of `per_head`. */
#define TSLOT (HEAD_DIM * VALUE_DIM)
#define T_SLOT(bh, slot, per_head)                                                                 \
    (((IDX)(bh) * (IDX)(CAUSAL ? (per_head) : 1) + (IDX)(CAUSAL ? (slot) : 0)) * TSLOT)

/* The slope of the feature map (elu(x) + 1: 1 above 0, exp(x) below; relu: 1 above 0, else 0;
 * identity: 1). */
inline float feature_slope(float x) {
#if FEATURE == 0
    return x > 0.0f ? 1.0f : exp(x);
#elif FEATURE == 1
    return x > 0.0f ? 1.0f : 0.0f;
#else
    return 1.0f;
#endif
}

#if VEC > 1
inline floatV feature_slope_lanes(floatV x) {
#if FEATURE == 0
    return select(exp(x), (floatV)1.0f, x > (floatV)0.0f);
#elif FEATURE == 1
    return select((floatV)0.0f, (floatV)1.0f, x > (floatV)0.0f);
#else
    return (floatV)1.0f;
#endif
}
#else
#define feature_slope_lanes feature_slope
#endif

/* The dot of two rows of lane vectors. */
#define LANES_DOT(a, b, n, out)                                                                    \
    do {                                                                                           \
        lane_t dot_ = (lane_t)0.0f;                                                                \
        UNROLL for (int c_ = 0; c_ < LANES(n); ++c_) dot_ = fma((a)[c_], (b)[c_], dot_);           \
        out = DOT_FINISH(dot_);                                                                    \
    } while (0)

/* acc[r] += sum_i x[r][i] m_i for r < BM, over the `rows` rows m_i of n floats of the f32 matrix
 * m (row-major): a broadcast-and-FMA per element of x, where x is a private float array. */
#define ADD_ROWS(acc, x, m, rows, n)                                                               \
    for (int i_ = 0; i_ < (rows); ++i_) {                                                          \
        lane_t row_[LANES(n)];                                                                     \
        LOAD_ROW(f32, m, (IDX)i_ * (n), 1, n, row_);                                               \
        UNROLL for (int r_ = 0; r_ < BM; ++r_)                                                     \
            UNROLL for (int c_ = 0; c_ < LANES(n); ++c_)                                           \
                acc[r_][c_] = fma((lane_t)((x)[r_][i_]), row_[c_], acc[r_][c_]);                   \
    }

/* A row as LOAD_ROW reads it where `cond` holds, else zeros (a row that is never read). */
#define LOAD_ROW_IF(cond, T, p, at, stride, n, out)                                                \
    do {                                                                                           \
        UNROLL for (int z_ = 0; z_ < LANES(n); ++z_) out[z_] = (lane_t)0.0f;                       \
        if (cond) LOAD_ROW(T, p, at, stride, n, out);                                              \
    } while (0)

/* A row of n floats in private memory, as lane vectors. */
#define PRIVATE_ROW(row, n, out)                                                                   \
    UNROLL for (int c_ = 0; c_ < LANES(n); ++c_) out[c_] = ROW_LANES(row, c_)

/* Stores a row of n floats, as lane vectors, to an output tensor row at `at` (element stride
 * `stride`): vector stores where the stride is 1 (element stores took a third of dk's and dv's
 * kernel in PoCL's code). */
#if VEC > 1
#define STORE_OUT_ROW(T, p, at, stride, n, lanes)                                                  \
    do {                                                                                           \
        if ((stride) == 1) {                                                                       \
            UNROLL for (int c_ = 0; c_ < LANES(n); ++c_)                                           \
                CAT(CAT(store, VEC), CAT(_, T))(p, (at) + (IDX)(c_ * VEC), (lanes)[c_]);           \
        } else {                                                                                   \
            float row_[n];                                                                         \
            UNROLL for (int c_ = 0; c_ < LANES(n); ++c_) STORE_ROW_LANES(row_, c_, (lanes)[c_]);   \
            UNROLL for (int d_ = 0; d_ < (n); ++d_)                                                \
                CAT(store_, T)(p, (at) + (IDX)d_ * (stride), row_[d_]);                            \
        }                                                                                          \
    } while (0)
#else
#define STORE_OUT_ROW(T, p, at, stride, n, lanes)                                                  \
    UNROLL for (int d_ = 0; d_ < (n); ++d_)                                                        \
        CAT(store_, T)(p, (at) + (IDX)d_ * (stride), (lanes)[d_])
#endif

__kernel void linear_query_grads(TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(V_T, v),
                                 TENSOR_PARAMS(DO_T, dout), OUT_PARAMS(DQ_T, dq),
                                 __global const float *states, __global const float *states_t,
                                 IDX states_t_off, __global const float *phik, IDX phik_off,
                                 __global float *terms, IDX terms_off, int B, int Hq,
                                 int Hkv, int Sq, int Sk, int chunk, int nchunks, float eps,
                                 MASK_PARAMS) {
    const int blocks = (Sq + BM - 1) / BM;
    const int item = (int)get_global_id(0);
    if (item >= B * Hq * blocks) return;
    const int i0 = (item % blocks) * BM, bh = item / blocks, h = bh % Hq, b = bh / Hq;
    const int bhk = b * Hkv + h / (Hq / Hkv), hk = bhk % Hkv;
    MASK_PACK(p);

    /* each query's end, the smallest and largest of those that see any key, and phi(q) (0 for
     * a query that sees no key, which is never read) */
    int end[BM], lo = Sk, hi = 0;
    float fq[BM][HEAD_DIM];
    UNROLL for (int r = 0; r < BM; ++r) {
        end[r] = i0 + r < Sq ? mask_row_start(&p, b, h, i0 + r, Sq, Sk).end : 0;
        if (end[r] > 0) lo = min(lo, end[r]), hi = max(hi, end[r]);
        lane_t row[LANES(HEAD_DIM)];
        LOAD_ROW_IF(end[r] > 0, Q_T, q, AT(q, b, h, i0 + r, 0), q_s3, HEAD_DIM, row);
        UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c)
            STORE_ROW_LANES(fq[r], c, end[r] > 0 ? feature_lanes(row[c]) : (lane_t)0.0f);
    }

    /* num and den, as the forward: the state of the whole chunks before the block's first
     * visible key past them, then (CAUSAL) each query's own keys one by one */
    const int whole = CAUSAL ? lo / chunk : nchunks;
    __global const float *state = states + ((IDX)bhk * (IDX)(nchunks + 1) + (IDX)whole) * SLOT;
    lane_t num[BM][LANES(VALUE_DIM)];
    float den[BM];
    UNROLL for (int r = 0; r < BM; ++r) {
        den[r] = 0.0f;
        UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c) num[r][c] = (lane_t)0.0f;
    }
    for (int d = 0; d < HEAD_DIM; ++d) {
        lane_t row[LANES(VALUE_DIM)];
        LOAD_ROW(f32, state, (IDX)d * VALUE_DIM, 1, VALUE_DIM, row);
        const float zd = state[HEAD_DIM * VALUE_DIM + d];
        UNROLL for (int r = 0; r < BM; ++r) {
            den[r] = fma(fq[r][d], zd, den[r]);
            UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c)
                num[r][c] = fma((lane_t)fq[r][d], row[c], num[r][c]);
        }
    }
#if CAUSAL
    for (int j = whole * chunk; j < hi; ++j) {
        lane_t key[LANES(HEAD_DIM)], value[LANES(VALUE_DIM)];
        LOAD_ROW(f32, phik, phik_off + ((IDX)bhk * (IDX)Sk + (IDX)j) * HEAD_DIM, 1, HEAD_DIM, key);
        LOAD_ROW(V_T, v, AT(v, b, hk, j, 0), v_s3, VALUE_DIM, value);
        UNROLL for (int r = 0; r < BM; ++r) {
            if (j >= end[r]) continue;
            lane_t dot = (lane_t)0.0f;
            UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c)
                dot = fma(ROW_LANES(fq[r], c), key[c], dot);
            const float weight = DOT_FINISH(dot);
            den[r] += weight;
            UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c)
                num[r][c] = fma((lane_t)weight, value[c], num[r][c]);
        }
    }
#endif

    /* dnum, dden, and each query's terms for the key side */
    lane_t dnum[BM][LANES(VALUE_DIM)];
    float dden[BM];
    UNROLL for (int r = 0; r < BM; ++r) {
        lane_t g[LANES(VALUE_DIM)];
        LOAD_ROW_IF(end[r] > 0, DO_T, dout, AT(dout, b, h, i0 + r, 0), dout_s3, VALUE_DIM, g);
        const float inv = end[r] > 0 ? 1.0f / (den[r] + eps) : 0.0f;
        float dot;
        LANES_DOT(g, num[r], VALUE_DIM, dot);
        dden[r] = -dot * inv * inv;
        UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c) dnum[r][c] = g[c] * inv;
        if (i0 + r >= Sq) continue;
        __global float *term = terms + terms_off + ((IDX)bh * (IDX)Sq + (IDX)(i0 + r)) * TERM;
        UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c)
            STORE_ROW_LANES(term, c, ROW_LANES(fq[r], c));
        UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c)
            STORE_ROW_LANES(term + HEAD_DIM, c, dnum[r][c]);
        term[HEAD_DIM + VALUE_DIM] = dden[r];
    }

    /* dphi(q) = S dnum + z dden: z dden, then S's columns (the rows of its transpose), then
     * (CAUSAL) the block's own keys */
    lane_t g[BM][LANES(HEAD_DIM)];
    {
        lane_t z[LANES(HEAD_DIM)];
        LOAD_ROW(f32, state, (IDX)HEAD_DIM * VALUE_DIM, 1, HEAD_DIM, z);
        UNROLL for (int r = 0; r < BM; ++r)
            UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c) g[r][c] = z[c] * dden[r];
    }
    {
        float dn[BM][VALUE_DIM];
        UNROLL for (int r = 0; r < BM; ++r)
            UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c) STORE_ROW_LANES(dn[r], c, dnum[r][c]);
        __global const float *state_t =
            states_t + states_t_off + T_SLOT(bhk, whole, nchunks + 1);
        ADD_ROWS(g, dn, state_t, VALUE_DIM, HEAD_DIM);
    }
#if CAUSAL
    for (int j = whole * chunk; j < hi; ++j) {
        lane_t key[LANES(HEAD_DIM)], value[LANES(VALUE_DIM)];
        LOAD_ROW(f32, phik, phik_off + ((IDX)bhk * (IDX)Sk + (IDX)j) * HEAD_DIM, 1, HEAD_DIM, key);
        LOAD_ROW(V_T, v, AT(v, b, hk, j, 0), v_s3, VALUE_DIM, value);
        UNROLL for (int r = 0; r < BM; ++r) {
            if (j >= end[r]) continue;
            float w;
            LANES_DOT(value, dnum[r], VALUE_DIM, w);
            w += dden[r];
            UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c)
                g[r][c] = fma((lane_t)w, key[c], g[r][c]);
        }
    }
#endif
    /* dq = phi'(q) o dphi(q), q read again for the slope */
    UNROLL for (int r = 0; r < BM; ++r) {
        if (i0 + r >= Sq) break;
        lane_t row[LANES(HEAD_DIM)];
        LOAD_ROW_IF(end[r] > 0, Q_T, q, AT(q, b, h, i0 + r, 0), q_s3, HEAD_DIM, row);
        UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c)
            row[c] = end[r] > 0 ? g[r][c] * feature_slope_lanes(row[c]) : (lane_t)0.0f;
        STORE_OUT_ROW(DQ_T, dq, AT(dq, b, h, i0 + r, 0), dq_s3, HEAD_DIM, row);
    }
}

/* Chunk `part` of the queries of kv head (b, hk), over its query heads: the sums of
 * phi(q) dnum^T (HEAD_DIM x VALUE_DIM) and phi(q) dden (HEAD_DIM) into slot `part`. */
__kernel void linear_term_states(__global const float *terms, IDX terms_off,
                                 __global float *qstates, IDX qstates_off, int B, int Hq, int Hkv,
                                 int Sq, int qchunk, int qchunks) {
    const int row_blocks = HEAD_DIM / ROWS;
    const int item = (int)get_global_id(0);
    if (item >= B * Hkv * qchunks * row_blocks) return;
    const int d0 = (item % row_blocks) * ROWS, unit = item / row_blocks;
    const int part = unit % qchunks, bhk = unit / qchunks, b = bhk / Hkv, hk = bhk % Hkv;
    const int group = Hq / Hkv, first = part * qchunk, last = min(first + qchunk, Sq);
    lane_t acc[ROWS][LANES(VALUE_DIM)];
    float a[ROWS];
    UNROLL for (int r = 0; r < ROWS; ++r) {
        a[r] = 0.0f;
        UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c) acc[r][c] = (lane_t)0.0f;
    }
    for (int h = hk * group; h < hk * group + group; ++h)
        for (int i = first; i < last; ++i) {
            __global const float *term =
                terms + terms_off + ((IDX)(b * Hq + h) * (IDX)Sq + (IDX)i) * TERM;
            lane_t dn[LANES(VALUE_DIM)];
            LOAD_ROW(f32, term, (IDX)HEAD_DIM, 1, VALUE_DIM, dn);
            const float dd = term[HEAD_DIM + VALUE_DIM];
            UNROLL for (int r = 0; r < ROWS; ++r) {
                const float f = term[d0 + r];
                a[r] = fma(f, dd, a[r]);
                UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c)
                    acc[r][c] = fma((lane_t)f, dn[c], acc[r][c]);
            }
        }
    __global float *slot =
        qstates + qstates_off + ((IDX)bhk * (IDX)(qchunks + 1) + (IDX)part) * SLOT;
    UNROLL for (int r = 0; r < ROWS; ++r) {
        UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c)
            STORE_ROW_LANES(slot + (IDX)(d0 + r) * VALUE_DIM, c, acc[r][c]);
        slot[HEAD_DIM * VALUE_DIM + d0 + r] = a[r];
    }
}

/* Slot c becomes the sum of slots c .. qchunks - 1, from the end; slot qchunks is zero. A
 * work-item per VEC lanes of a row (the first of a row also takes its HEAD_DIM part). */
__kernel void linear_term_scan(__global float *qstates, IDX qstates_off, int BH, int qchunks) {
    const int item = (int)get_global_id(0);
    if (item >= BH * HEAD_DIM * LANES(VALUE_DIM)) return;
    const int c = item % LANES(VALUE_DIM), row = item / LANES(VALUE_DIM);
    const int d = row % HEAD_DIM, bh = row / HEAD_DIM;
    __global float *base = qstates + qstates_off + (IDX)bh * (IDX)(qchunks + 1) * SLOT;
    IDX at = (IDX)qchunks * SLOT + (IDX)d * VALUE_DIM + (IDX)(c * VEC);
    IDX a_at = (IDX)qchunks * SLOT + HEAD_DIM * VALUE_DIM + (IDX)d;
    float run[VEC], a_run = 0.0f;
    for (int e = 0; e < VEC; ++e) run[e] = 0.0f, base[at + (IDX)e] = 0.0f;
    if (c == 0) base[a_at] = 0.0f;
    for (int slot = qchunks - 1; slot >= 0; --slot) {
        at -= SLOT, a_at -= SLOT;
        for (int e = 0; e < VEC; ++e) run[e] += base[at + (IDX)e], base[at + (IDX)e] = run[e];
        if (c == 0) a_run += base[a_at], base[a_at] = a_run;
    }
}

/* Slots first .. first + count - 1 of each head's per_head states (S, z; SLOT floats a slot)
 * into `to` as S^T alone (VALUE_DIM x HEAD_DIM, row-major; TSLOT floats a slot), count slots a
 * head (T_SLOT gives where the readers find one), which the gradient kernels read for S's
 * columns: a broadcast-and-FMA a column, where S's rows would take a dot and its horizontal sum
 * per element. A work-item per row of S^T (consecutive ones read consecutive floats of S). */
__kernel void linear_transpose_states(__global const float *from, IDX from_off, __global float *to,
                                      IDX to_off, int BH, int per_head, int first, int count) {
    const int item = (int)get_global_id(0);
    if (item >= BH * count * VALUE_DIM) return;
    const int e = item % VALUE_DIM, unit = item / VALUE_DIM;
    const IDX slot = (IDX)(unit / count) * (IDX)per_head + (IDX)(first + unit % count);
    __global const float *column = from + from_off + slot * SLOT + (IDX)e;
    __global float *row = to + to_off + (IDX)unit * TSLOT + (IDX)e * HEAD_DIM;
    for (int d = 0; d < HEAD_DIM; ++d) row[d] = column[(IDX)d * VALUE_DIM];
}

/* The first query that sees key j of batch b (Sq when none does): causal, i >= j - off below
 * the query length; else every query below it, for a key below the key length. */
inline int first_query(const mask_params *p, int b, int j, int Sq, int Sk) {
    const mask_row first = mask_row_start(p, b, 0, 0, Sq, Sk);
    int qlen = Sq;
#if HAS_QLEN
    qlen = clamp(p->qlen[p->qlen_off + (IDX)b * p->qlen_s], 0, Sq);
#endif
    if (j >= mask_key_length(p, b, Sk)) return Sq;
    const int f = CAUSAL ? max(0, j - first.pos) : 0; /* first.pos = off */
    return f < qlen ? f : Sq;
}

__kernel void linear_key_grads(TENSOR_PARAMS(K_T, k), TENSOR_PARAMS(V_T, v), OUT_PARAMS(DK_T, dk),
                               OUT_PARAMS(DV_T, dv), __global const float *phik, IDX phik_off,
                               __global const float *terms, IDX terms_off,
                               __global const float *qstates, IDX qstates_off,
                               __global const float *qstates_t, IDX qstates_t_off, int B, int Hq,
                               int Hkv, int Sq, int Sk, int qchunk, int qchunks, MASK_PARAMS) {
    const int blocks = (Sk + BM - 1) / BM;
    const int item = (int)get_global_id(0);
    if (item >= B * Hkv * blocks) return;
    const int j0 = (item % blocks) * BM, bhk = item / blocks, hk = bhk % Hkv, b = bhk / Hkv;
    const int group = Hq / Hkv;
    MASK_PACK(p);

    /* each key's first query, phi(k) and v (0 for a key no query sees); the block reads the
     * state of the query chunks from the first whole chunk that its last-seen key's queries
     * cover */
    int first[BM], lo = Sq, hi = 0;
    float fk[BM][HEAD_DIM], value[BM][VALUE_DIM];
    UNROLL for (int r = 0; r < BM; ++r) {
        const int j = j0 + r;
        first[r] = j < Sk ? first_query(&p, b, j, Sq, Sk) : Sq;
        const bool seen = first[r] < Sq;
        if (seen) lo = min(lo, first[r]), hi = max(hi, first[r]);
        lane_t row[LANES(HEAD_DIM)], vrow[LANES(VALUE_DIM)];
        LOAD_ROW_IF(seen, f32, phik, phik_off + ((IDX)bhk * (IDX)Sk + (IDX)j) * HEAD_DIM, 1,
                    HEAD_DIM, row);
        LOAD_ROW_IF(seen, V_T, v, AT(v, b, hk, j, 0), v_s3, VALUE_DIM, vrow);
        UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c) STORE_ROW_LANES(fk[r], c, row[c]);
        UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c) STORE_ROW_LANES(value[r], c, vrow[c]);
    }
    const int whole = min((hi + qchunk - 1) / qchunk, qchunks);
    __global const float *state =
        qstates + qstates_off + ((IDX)bhk * (IDX)(qchunks + 1) + (IDX)whole) * SLOT;

    /* dv = R^T phi(k) from R's rows, dphi(k) = r + R v from R's columns (the rows of its
     * transpose)... */
    lane_t gv[BM][LANES(VALUE_DIM)], gk[BM][LANES(HEAD_DIM)];
    {
        lane_t sums[LANES(HEAD_DIM)];
        LOAD_ROW(f32, state, (IDX)HEAD_DIM * VALUE_DIM, 1, HEAD_DIM, sums);
        UNROLL for (int r = 0; r < BM; ++r) {
            UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c) gv[r][c] = (lane_t)0.0f;
            UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c) gk[r][c] = sums[c];
        }
    }
    ADD_ROWS(gv, fk, state, HEAD_DIM, VALUE_DIM);
    __global const float *state_t = qstates_t + qstates_t_off + T_SLOT(bhk, whole, qchunks + 1);
    ADD_ROWS(gk, value, state_t, VALUE_DIM, HEAD_DIM);
    /* ...and the queries before that chunk, each key from its own first query */
    for (int h = hk * group; h < hk * group + group; ++h)
        for (int i = lo; i < min(whole * qchunk, Sq); ++i) {
            __global const float *term =
                terms + terms_off + ((IDX)(b * Hq + h) * (IDX)Sq + (IDX)i) * TERM;
            lane_t fq[LANES(HEAD_DIM)], dn[LANES(VALUE_DIM)];
            LOAD_ROW(f32, term, (IDX)0, 1, HEAD_DIM, fq);
            LOAD_ROW(f32, term, (IDX)HEAD_DIM, 1, VALUE_DIM, dn);
            const float dd = term[HEAD_DIM + VALUE_DIM];
            UNROLL for (int r = 0; r < BM; ++r) {
                if (i < first[r]) continue;
                lane_t fr[LANES(HEAD_DIM)], vr[LANES(VALUE_DIM)];
                PRIVATE_ROW(fk[r], HEAD_DIM, fr);
                PRIVATE_ROW(value[r], VALUE_DIM, vr);
                float w, c2;
                LANES_DOT(fq, fr, HEAD_DIM, w);
                LANES_DOT(vr, dn, VALUE_DIM, c2);
                c2 += dd;
                UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c)
                    gv[r][c] = fma((lane_t)w, dn[c], gv[r][c]);
                UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c)
                    gk[r][c] = fma((lane_t)c2, fq[c], gk[r][c]);
            }
        }
    /* dk = phi'(k) o dphi(k), k read for the slope; dv */
    UNROLL for (int r = 0; r < BM; ++r) {
        const int j = j0 + r;
        if (j >= Sk) break;
        const bool seen = first[r] < Sq;
        lane_t row[LANES(HEAD_DIM)];
        LOAD_ROW_IF(seen, K_T, k, AT(k, b, hk, j, 0), k_s3, HEAD_DIM, row);
        UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c)
            row[c] = seen ? gk[r][c] * feature_slope_lanes(row[c]) : (lane_t)0.0f;
        STORE_OUT_ROW(DK_T, dk, AT(dk, b, hk, j, 0), dk_s3, HEAD_DIM, row);
        UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c)
            if (!seen) gv[r][c] = (lane_t)0.0f;
        STORE_OUT_ROW(DV_T, dv, AT(dv, b, hk, j, 0), dv_s3, VALUE_DIM, gv[r]);
    }
}
