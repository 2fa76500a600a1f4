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
 *   linear_query_grads  a work-item per BM queries of one (batch, query head): num and den as
 *                       the forward computes them, then dq; and each query's terms (phi(q_i),
 *                       dnum_i, dden_i: TERM floats) into scratch, zeros for a query that sees
 *                       no key.
 *   linear_term_states  a work-item per ROWS rows of one chunk of queries of one (batch, kv
 *                       head): the chunk's sums of phi(q) dnum^T and phi(q) dden over the query
 *                       heads of the kv head (in slot c, SLOT floats as the forward's states).
 *   linear_term_scan    a work-item per VEC lanes of a state row: slot c becomes the sum of the
 *                       chunks from c to the end (slot qchunks: zero), in reverse order.
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

/* A row of n floats in private memory, as lane vectors. */
#define PRIVATE_ROW(row, n, out)                                                                   \
    UNROLL for (int c_ = 0; c_ < LANES(n); ++c_) out[c_] = ROW_LANES(row, c_)

/* Stores a private float row of n to an output tensor row at `at` (element stride `stride`). */
#define STORE_OUT_ROW(T, p, at, stride, n, row)                                                    \
    UNROLL for (int d_ = 0; d_ < (n); ++d_) CAT(store_, T)(p, (at) + (IDX)d_ * (stride), (row)[d_])

__kernel void linear_query_grads(TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(V_T, v),
                                 TENSOR_PARAMS(DO_T, dout), OUT_PARAMS(DQ_T, dq),
                                 __global const float *states, __global const float *phik,
                                 IDX phik_off, __global float *terms, IDX terms_off, int B, int Hq,
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
        UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c) row[c] = (lane_t)0.0f;
        if (end[r] > 0) LOAD_ROW(Q_T, q, AT(q, b, h, i0 + r, 0), q_s3, HEAD_DIM, row);
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
        UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c) g[c] = (lane_t)0.0f;
        if (end[r] > 0) LOAD_ROW(DO_T, dout, AT(dout, b, h, i0 + r, 0), dout_s3, VALUE_DIM, g);
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

    /* dphi(q) = S dnum + z dden: the state's rows, then (CAUSAL) the block's own keys */
    float g[BM][HEAD_DIM];
    for (int d = 0; d < HEAD_DIM; ++d) {
        lane_t row[LANES(VALUE_DIM)];
        LOAD_ROW(f32, state, (IDX)d * VALUE_DIM, 1, VALUE_DIM, row);
        const float zd = state[HEAD_DIM * VALUE_DIM + d];
        UNROLL for (int r = 0; r < BM; ++r) {
            float dot;
            LANES_DOT(row, dnum[r], VALUE_DIM, dot);
            g[r][d] = fma(zd, dden[r], dot);
        }
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
                STORE_ROW_LANES(g[r], c, fma((lane_t)w, key[c], ROW_LANES(g[r], c)));
        }
    }
#endif
    /* dq = phi'(q) o dphi(q), q read again for the slope */
    UNROLL for (int r = 0; r < BM; ++r) {
        if (i0 + r >= Sq) break;
        lane_t row[LANES(HEAD_DIM)];
        UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c) row[c] = (lane_t)0.0f;
        if (end[r] > 0) LOAD_ROW(Q_T, q, AT(q, b, h, i0 + r, 0), q_s3, HEAD_DIM, row);
        UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c) {
            const lane_t grad = ROW_LANES(g[r], c) * feature_slope_lanes(row[c]);
            STORE_ROW_LANES(g[r], c, end[r] > 0 ? grad : (lane_t)0.0f);
        }
        STORE_OUT_ROW(DQ_T, dq, AT(dq, b, h, i0 + r, 0), dq_s3, HEAD_DIM, g[r]);
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
                               __global const float *qstates, IDX qstates_off, int B, int Hq,
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
    float fk[BM][HEAD_DIM];
    lane_t value[BM][LANES(VALUE_DIM)];
    UNROLL for (int r = 0; r < BM; ++r) {
        const int j = j0 + r;
        first[r] = j < Sk ? first_query(&p, b, j, Sq, Sk) : Sq;
        const bool seen = first[r] < Sq;
        if (seen) lo = min(lo, first[r]), hi = max(hi, first[r]);
        lane_t row[LANES(HEAD_DIM)];
        UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c) row[c] = (lane_t)0.0f;
        UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c) value[r][c] = (lane_t)0.0f;
        if (seen) {
            LOAD_ROW(f32, phik, phik_off + ((IDX)bhk * (IDX)Sk + (IDX)j) * HEAD_DIM, 1, HEAD_DIM,
                     row);
            LOAD_ROW(V_T, v, AT(v, b, hk, j, 0), v_s3, VALUE_DIM, value[r]);
        }
        UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c) STORE_ROW_LANES(fk[r], c, row[c]);
    }
    const int whole = min((hi + qchunk - 1) / qchunk, qchunks);
    __global const float *state =
        qstates + qstates_off + ((IDX)bhk * (IDX)(qchunks + 1) + (IDX)whole) * SLOT;

    /* dv = R^T phi(k), dphi(k) = R v + r from the state... */
    lane_t gv[BM][LANES(VALUE_DIM)];
    float gk[BM][HEAD_DIM];
    UNROLL for (int r = 0; r < BM; ++r)
        UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c) gv[r][c] = (lane_t)0.0f;
    for (int d = 0; d < HEAD_DIM; ++d) {
        lane_t row[LANES(VALUE_DIM)];
        LOAD_ROW(f32, state, (IDX)d * VALUE_DIM, 1, VALUE_DIM, row);
        const float ad = state[HEAD_DIM * VALUE_DIM + d];
        UNROLL for (int r = 0; r < BM; ++r) {
            UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c)
                gv[r][c] = fma((lane_t)fk[r][d], row[c], gv[r][c]);
            float dot;
            LANES_DOT(row, value[r], VALUE_DIM, dot);
            gk[r][d] = dot + ad;
        }
    }
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
                lane_t fr[LANES(HEAD_DIM)];
                PRIVATE_ROW(fk[r], HEAD_DIM, fr);
                float w, c2;
                LANES_DOT(fq, fr, HEAD_DIM, w);
                LANES_DOT(value[r], dn, VALUE_DIM, c2);
                c2 += dd;
                UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c)
                    gv[r][c] = fma((lane_t)w, dn[c], gv[r][c]);
                UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c)
                    STORE_ROW_LANES(gk[r], c, fma((lane_t)c2, fq[c], ROW_LANES(gk[r], c)));
            }
        }
    /* dk = phi'(k) o dphi(k), k read for the slope; dv */
    UNROLL for (int r = 0; r < BM; ++r) {
        const int j = j0 + r;
        if (j >= Sk) break;
        const bool seen = first[r] < Sq;
        lane_t row[LANES(HEAD_DIM)];
        UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c) row[c] = (lane_t)0.0f;
        if (seen) LOAD_ROW(K_T, k, AT(k, b, hk, j, 0), k_s3, HEAD_DIM, row);
        UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c) {
            const lane_t grad = ROW_LANES(gk[r], c) * feature_slope_lanes(row[c]);
            STORE_ROW_LANES(gk[r], c, seen ? grad : (lane_t)0.0f);
        }
        STORE_OUT_ROW(DK_T, dk, AT(dk, b, hk, j, 0), dk_s3, HEAD_DIM, gk[r]);
        float out[VALUE_DIM];
        UNROLL for (int c = 0; c < LANES(VALUE_DIM); ++c)
            STORE_ROW_LANES(out, c, seen ? gv[r][c] : (lane_t)0.0f);
        STORE_OUT_ROW(DV_T, dv, AT(dv, b, hk, j, 0), dv_s3, VALUE_DIM, out);
    }
}
