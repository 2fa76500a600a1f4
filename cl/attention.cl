/*
 * Fused scaled-dot-product attention: out = softmax(mask(scale * q k^T)) v, never storing the
 * Sq x Sk scores. The mask is cl/mask.cl's (x = q_i . k_j there).
 *
 *   attention_blocks  one work-item per BM consecutive queries of one (batch, query head); it
 *                     walks the keys the block can see in tiles of BN, with an online softmax
 *                     (one rescale per tile): every K and V row it loads serves BM queries.
 *                     A CPU (PoCL) runs it as straight vector code; it is correct anywhere.
 *   attention_tiles   one work-group per block of get_local_size(0) queries of one (batch, query
 *                     head), one query per work-item; the group loads TK keys and values at a
 *                     time into local memory, coalesced, and every work-item reads them from
 *                     there (one broadcast read per FMA). The GPU variant: the blocks variant
 *                     runs far too few work-items to fill a GPU (an H100 ran it at 0.1% of its
 *                     FMA peak).
 *   attention_keys    one work-group per query row (and key split): its work-items share the
 *                     row's keys, one key each at a time, keep the scores in local memory, and
 *                     then share p.v: each work-item a VEC-wide chunk of the value dims over
 *                     every (group / chunks)-th key, the partial sums added through local
 *                     memory. The GPU variant for decoding (Sq <= 8), where a work-item per
 *                     query would leave a GPU idle; at most KEYS_CHUNK keys per group, so
 *                     longer rows are always split. With ALIGNED (K and V rows start
 *                     VEC-aligned) every K and V access is one aligned vector load.
 *   attention_lanes   the CPU variant: keys along the vector lanes. One work-item (groups of
 *                     one) per BM queries of one (batch, query head) against tiles of VEC keys,
 *                     LANE_TILES of them a step: a score tile is BM vectors of VEC keys, built
 *                     by broadcasting q[t][d] and loading the VEC keys' d-th components as one
 *                     vector from K packed d-major by attention_pack_keys, so no score ends in
 *                     a horizontal sum;
 *                     p.v broadcasts p[t][j] against V row j as vectors. Every multiply is a
 *                     full-width vector FMA, and the masks, the exponentials and the rescale
 *                     work on whole vectors of keys.
 *   attention_micro   the register-tiled GPU variant: one work-group per block of ROWS x MQ
 *                     queries of one (batch, query head), its work-items a ROWS x COLS grid
 *                     (COLS = TK / MK). The block's queries, a TK-key K tile and its V tile
 *                     sit in local memory; each work-item computes an MQ x MK tile of scores
 *                     (its rows ty + a*ROWS, its keys tx + c*COLS), so every value it reads
 *                     from local memory feeds MK or MQ FMAs, then an MQ x ceil(VALUE_DIM / COLS)
 *                     tile of the output (value dims tx + c*COLS) from the tile's weights,
 *                     which pass through local memory. A row's running max is combined across
 *                     its COLS work-items through local memory once a tile; its sum is kept
 *                     per work-item and combined at the end.
 *   attention_mma     f16/bf16 prefill on NVIDIA's matrix units (cl/mma.cl), f32 on its tf32
 *                     unit as three products a product (3xTF32), and
 *   attention_units   the same on the subgroup tile of any vendor's: described at each kernel.
 *   attention_merge   with SPLIT (decoding: few queries, long keys; attention_mma with
 *                     UNIT_SPLIT), a kernel above takes one of `splits` chunks of the keys per
 *                     work-item or group and writes a partial (max, sum, acc) to scratch; this
 *                     kernel merges the partials by their log-sum-exp.
 *
 * Query head h reads key/value head h / (Hq / Hkv): MHA, GQA and MQA are one code path.
 * A query with no visible key gets 0 (NaN with EMPTY_NAN) and log-sum-exp -inf; a NaN visible
 * score makes its row NaN.
 *
 * Build options: Q_T, K_T, V_T, O_T, LSE_T (f32|f16|bf16), HAS_LSE, HEAD_DIM, VALUE_DIM, VEC
 * (head-dim lanes), BM, BN (blocks), TK (tiles, micro), MQ, MK, ROWS (micro), ALIGNED (keys,
 * tiles: K and V rows start VEC-aligned), SPLIT, IDX,
 * EMPTY_NAN, the mask's, and VARIANT (0 blocks, 1 tiles, 2 keys, 3 lanes with its pack, 4
 * micro, 5 mma, 6 units; their MMA_* options at each): the one variant kernel the program
 * holds, beside the merge. A device then compiles only the variants its calls run (the lanes
 * kernel alone was more than half of the whole file's build time for Intel GPUs); without
 * VARIANT every kernel is built.
 */
#ifndef CLATTN_COMMON_CL
#include "common.cl"
#endif
#ifndef CLATTN_MASK_CL
#include "mask.cl"
#endif

#ifndef LSE_T
#define LSE_T f32
#endif
#ifndef HAS_LSE
#define HAS_LSE 0
#endif
#ifndef BM
#define BM 4
#endif
#ifndef BN
#define BN 16
#endif
#ifndef TK
#define TK 16
#endif
/* Splits of the key axis (SPLIT 1): each work-item (blocks) or group (tiles, keys, micro, mma)
 * takes one of `splits` chunks of `chunk` keys and writes a partial result, and attention_merge
 * combines them. The count and the chunk are arguments, not build options, so that every count
 * shares one program: a decoding loop's growing cache changes the count every few hundred
 * keys, and each count built a program of its own (on PoCL 0.65 s each, eight of them from 16
 * to 4096 keys). */
#ifndef SPLIT
#define SPLIT 0
#endif
#if SPLIT
#define SPLITS splits
#else
#define SPLITS 1
#endif
/* attention_keys: the most keys one group takes, and the largest group it is launched with */
#ifndef KEYS_CHUNK
#define KEYS_CHUNK 1024
#endif
#ifndef KEYS_GROUP
#define KEYS_GROUP 128
#endif
#ifndef EMPTY_NAN
#define EMPTY_NAN 0
#endif
/* The outputs of a row with no visible key, in every variant and the merge. */
#define EMPTY_VALUE (EMPTY_NAN ? NAN : 0.0f)
/* VEC, the lanes of the head-dim vectors (1: scalar code), must divide HEAD_DIM and VALUE_DIM;
 * rows.cl holds its default and the dtype and head-dim defaults. */
#ifndef CLATTN_ROWS_CL
#include "rows.cl"
#endif

#if HAS_LSE
#define LSE_PARAMS                                                                                 \
    , __global CAT(storage_, LSE_T) * lse, IDX lse_off, IDX lse_s1, IDX lse_s2, IDX lse_s3
#else
#define LSE_PARAMS
#endif

#if SPLIT
#define PART_PARAMS , __global float *part, int chunk, int splits
/* Keys outside the work-item's split are hidden. */
#define CLIP_TO_SPLIT(r, split) mask_row_clip(&(r), (split)*chunk, (split)*chunk + chunk)
#else
#define PART_PARAMS
#define CLIP_TO_SPLIT(r, split) (void)0
#endif

/* Query row i's output (acc / l) and log-sum-exp from its online-softmax state. A row that saw
 * no key gets 0 (NaN with EMPTY_NAN) and -inf; a NaN score makes it NaN. Scalar stores: one per
 * output, any alignment. */
#if HAS_LSE
#define STORE_LSE(i, value)                                                                        \
    CAT(store_, LSE_T)(lse, lse_off + (IDX)b * lse_s1 + (IDX)h * lse_s2 + (IDX)(i)*lse_s3, value)
#else
#define STORE_LSE(i, value) (void)0
#endif
#define STORE_QUERY_ROW(i, acc, m, l, nan_seen)                                                    \
    do {                                                                                           \
        const bool empty_ = (m) == -INFINITY && !(nan_seen);                                       \
        const float inv_ = (nan_seen) ? NAN : 1.0f / (l);                                          \
        for (int c = 0; c < LANES(VALUE_DIM); ++c) {                                               \
            lane_t value_ = empty_ ? (lane_t)EMPTY_VALUE : (acc)[c] * inv_;                        \
            STORE_LANES(i, c, value_)                                                              \
        }                                                                                          \
        STORE_LSE(i, empty_ ? -INFINITY : (nan_seen) ? NAN : (m) + log(l));                        \
    } while (0)

/* A split's partial result for query row i of head bh: its running max m (NaN when a score was
 * NaN), its sum l, and its unnormalized acc, VALUE_DIM + 2 floats. */
#if VEC > 1
#define STORE_PART_LANES(at, c, value)                                                             \
    for (int e = 0; e < VEC; ++e) (at)[(c)*VEC + e] = ((float *)&(value))[e]
#else
#define STORE_PART_LANES(at, c, value) (at)[c] = (value)
#endif
#define STORE_PARTIAL(i, acc, m, l, nan_seen)                                                      \
    do {                                                                                           \
        __global float *at_ = part + ((IDX)(bh * Sq + (i)) * SPLITS + split) * (VALUE_DIM + 2);    \
        at_[0] = (nan_seen) ? NAN : (m);                                                           \
        at_[1] = (l);                                                                              \
        for (int c = 0; c < LANES(VALUE_DIM); ++c) STORE_PART_LANES(at_ + 2, c, (acc)[c]);         \
    } while (0)
#if SPLIT
#define STORE_RESULT STORE_PARTIAL
#else
#define STORE_RESULT STORE_QUERY_ROW
#endif

#ifdef VARIANT
#define BUILDS(variant) (VARIANT == (variant))
#else
#define BUILDS(variant) 1
#endif

#if BUILDS(0)

__kernel void attention_blocks(TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(K_T, k), TENSOR_PARAMS(V_T, v),
                               __global CAT(storage_, O_T) * o, IDX o_off, IDX o_s0, IDX o_s1,
                               IDX o_s2, IDX o_s3, int B, int Hq, int Hkv, int Sq,
                               int Sk LSE_PARAMS PART_PARAMS, MASK_PARAMS) {
    const int blocks = (Sq + BM - 1) / BM;
    const int item = (int)get_global_id(0);
    if (item >= B * Hq * blocks * SPLITS) return;
    const int split = item % SPLITS, unit = item / SPLITS;
    const int i0 = (unit % blocks) * BM, bh = unit / blocks, h = bh % Hq, b = bh / Hq;
    const int hk = h / (Hq / Hkv);
    MASK_PACK(p);

    /* the block's queries: their masks, their vectors, their running softmax state */
    mask_row r[BM];
    lane_t qv[BM][LANES(HEAD_DIM)], acc[BM][LANES(VALUE_DIM)];
    float m[BM], l[BM];
    int nan_seen[BM];
    int lo = Sk, hi = 0;
    for (int t = 0; t < BM; ++t) {
        const int i = min(i0 + t, Sq - 1); /* rows past Sq repeat the last one, unwritten */
        r[t] = mask_row_start(&p, b, h, i, Sq, Sk);
        CLIP_TO_SPLIT(r[t], split);
        if (i0 + t >= Sq) r[t].hi = r[t].lo; /* and see nothing */
        lo = min(lo, r[t].lo);
        hi = max(hi, r[t].hi);
        LOAD_ROW(Q_T, q, AT(q, b, h, i, 0), q_s3, HEAD_DIM, qv[t]);
        for (int c = 0; c < LANES(VALUE_DIM); ++c) acc[t][c] = 0.0f;
        m[t] = -INFINITY;
        l[t] = 0.0f;
        nan_seen[t] = 0;
    }

    for (int j0 = lo; j0 < hi; j0 += BN) {
        /* raw dot products of the tile; keys no query of the block can see are skipped */
        float dots[BM][BN];
        for (int jj = 0; jj < BN; ++jj) {
            const int j = j0 + jj;
            lane_t kv[LANES(HEAD_DIM)];
            if (j < hi) LOAD_ROW(K_T, k, AT(k, b, hk, j, 0), k_s3, HEAD_DIM, kv);
            for (int t = 0; t < BM; ++t) {
                lane_t dot = 0.0f;
                if (j < r[t].hi && j >= r[t].lo)
                    for (int c = 0; c < LANES(HEAD_DIM); ++c) dot = fma(qv[t][c], kv[c], dot);
                dots[t][jj] = DOT_FINISH(dot);
            }
        }
        /* the masked scores and the online softmax, one rescale per query per tile. A full tile
         * of VEC (= BN) keys is masked and exponentiated as one vector. */
        float pr[BM][BN];
        for (int t = 0; t < BM; ++t) {
            float s[BN];
#if VEC == BN
            const bool full = j0 + BN <= hi;
            if (full)
                CAT(vstore, VEC)(mask_chunk_score(&p, &r[t], j0, CAT(vload, VEC)(0, dots[t])), 0,
                                 s);
#else
            const bool full = false;
#endif
            if (!full)
                for (int jj = 0; jj < BN; ++jj) {
                    const int j = j0 + jj;
                    s[jj] = j < r[t].hi && j >= r[t].lo ? mask_score(&p, &r[t], j, dots[t][jj])
                                                        : -INFINITY;
                }
            float tile_max = -INFINITY;
            for (int jj = 0; jj < BN; ++jj) {
                tile_max = fmax(tile_max, s[jj]);
                nan_seen[t] |= isnan(s[jj]);
            }
            const float m_new = fmax(m[t], tile_max);
            const float keep = m_new == -INFINITY ? 0.0f : exp(m[t] - m_new);
            float sum = 0.0f;
#if VEC == BN
            floatV sv = CAT(vload, VEC)(0, s);
            floatV e = select(exp(sv - m_new), (floatV)0.0f, sv == (floatV)(-INFINITY));
            CAT(vstore, VEC)(e, 0, pr[t]);
            sum = hsum(e);
#else
            for (int jj = 0; jj < BN; ++jj) {
                pr[t][jj] = s[jj] == -INFINITY ? 0.0f : exp(s[jj] - m_new);
                sum += pr[t][jj];
            }
#endif
            l[t] = l[t] * keep + sum;
            for (int c = 0; c < LANES(VALUE_DIM); ++c) acc[t][c] *= keep;
            m[t] = m_new;
        }
        /* acc += p v, each V row loaded once for the whole block; a zero weight skips the row,
         * so whatever an invisible V row holds (NaN, Inf) never reaches acc */
        for (int jj = 0; jj < BN && j0 + jj < hi; ++jj) {
            lane_t vv[LANES(VALUE_DIM)];
            LOAD_ROW(V_T, v, AT(v, b, hk, j0 + jj, 0), v_s3, VALUE_DIM, vv);
            for (int t = 0; t < BM; ++t) {
                const float w = pr[t][jj];
                if (w != 0.0f)
                    for (int c = 0; c < LANES(VALUE_DIM); ++c)
                        acc[t][c] = fma((lane_t)w, vv[c], acc[t][c]);
            }
        }
    }

    for (int t = 0; t < BM && i0 + t < Sq; ++t)
        STORE_RESULT(i0 + t, acc[t], m[t], l[t], nan_seen[t]);
}

#endif /* BUILDS(0) */

#if BUILDS(1)

/* Rows j0 .. j0 + TK - 1 of a [Sk, n] matrix into the local tile (TK rows of LANES(n) lane
 * vectors); rows at or past `hi` read as 0. Consecutive work-items read consecutive lane
 * vectors of a row (LOAD_LANES: aligned vector loads with ALIGNED). */
#define LOAD_TILE(T, p, b, h, j0, hi, n, tile)                                                     \
    for (int e = (int)get_local_id(0); e < TK * LANES(n); e += (int)get_local_size(0)) {           \
        const int j_ = (j0) + e / LANES(n), c_ = e % LANES(n);                                     \
        if (j_ < (hi))                                                                             \
            (tile)[e] = TILE_LANES(T, p, AT(p, b, h, j_, c_ * VEC), p##_s3);                       \
        else                                                                                       \
            (tile)[e] = (lane_t)0.0f;                                                              \
    }
#if VEC > 1
#define TILE_LANES(T, p, at, stride) LOAD_LANES(T, p, at, stride)
#else
#define TILE_LANES(T, p, at, stride) CAT(load_, T)(p, at)
#endif

__kernel void attention_tiles(TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(K_T, k), TENSOR_PARAMS(V_T, v),
                              __global CAT(storage_, O_T) * o, IDX o_off, IDX o_s0, IDX o_s1,
                              IDX o_s2, IDX o_s3, int B, int Hq, int Hkv, int Sq,
                              int Sk, int order LSE_PARAMS PART_PARAMS, MASK_PARAMS) {
    __local lane_t kt[TK * LANES(HEAD_DIM)], vt[TK * LANES(VALUE_DIM)];
    __local int span[2];
    const int nq = (int)get_local_size(0), blocks = (Sq + nq - 1) / nq;
    const int group = (int)get_group_id(0), split = group % SPLITS;
    const int2 at = unit_place(group / SPLITS, blocks, B * Hq, order);
    const int bh = at.x, h = bh % Hq, b = bh / Hq, hk = h / (Hq / Hkv);
    const int i = at.y * nq + (int)get_local_id(0);
    MASK_PACK(p);
    mask_row r = mask_row_start(&p, b, h, min(i, Sq - 1), Sq, Sk);
    CLIP_TO_SPLIT(r, split);
    if (i >= Sq) r.hi = r.lo; /* a work-item past Sq only helps load tiles */
    const int2 keys = group_key_span(span, r.lo, r.hi, Sk);

    lane_t qv[LANES(HEAD_DIM)], acc[LANES(VALUE_DIM)];
    LOAD_ROW(Q_T, q, AT(q, b, h, min(i, Sq - 1), 0), q_s3, HEAD_DIM, qv);
    for (int c = 0; c < LANES(VALUE_DIM); ++c) acc[c] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    int nan_seen = 0;
    for (int j0 = keys.x; j0 < keys.y; j0 += TK) {
        barrier(CLK_LOCAL_MEM_FENCE); /* everyone is done with the last tile */
        LOAD_TILE(K_T, k, b, hk, j0, keys.y, HEAD_DIM, kt);
        LOAD_TILE(V_T, v, b, hk, j0, keys.y, VALUE_DIM, vt);
        barrier(CLK_LOCAL_MEM_FENCE);
        float w[TK], tile_max = -INFINITY;
        for (int jj = 0; jj < TK; ++jj) {
            const int j = j0 + jj;
            float x = -INFINITY;
            if (j >= r.lo && j < r.hi) {
                lane_t dot = 0.0f;
                for (int c = 0; c < LANES(HEAD_DIM); ++c) dot = fma(qv[c], kt[jj * LANES(HEAD_DIM) + c], dot);
                x = mask_score(&p, &r, j, DOT_FINISH(dot));
            }
            w[jj] = x;
            tile_max = fmax(tile_max, x);
            nan_seen |= isnan(x);
        }
        const float m_new = fmax(m, tile_max);
        const float keep = m_new == -INFINITY ? 0.0f : exp(m - m_new);
        float sum = 0.0f;
        for (int jj = 0; jj < TK; ++jj) {
            w[jj] = w[jj] == -INFINITY ? 0.0f : exp(w[jj] - m_new);
            sum += w[jj];
        }
        l = l * keep + sum;
        m = m_new;
        for (int c = 0; c < LANES(VALUE_DIM); ++c) acc[c] *= keep;
        /* a zero weight skips its V row: what an invisible row holds (NaN, Inf) never counts */
        for (int jj = 0; jj < TK; ++jj)
            if (w[jj] != 0.0f)
                for (int c = 0; c < LANES(VALUE_DIM); ++c)
                    acc[c] = fma((lane_t)w[jj], vt[jj * LANES(VALUE_DIM) + c], acc[c]);
    }
    if (i < Sq) STORE_RESULT(i, acc, m, l, nan_seen);
}

#endif /* BUILDS(1) */

#if BUILDS(2)
/* The maximum (is_max) or the sum of one value per work-item over the group, for every
 * work-item. The group size is a power of two, at most KEYS_GROUP; `scratch` holds KEYS_GROUP
 * floats. */
inline float group_reduce(__local float *scratch, float value, int is_max) {
    const int lid = (int)get_local_id(0);
    scratch[lid] = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int half_n = (int)get_local_size(0) / 2; half_n > 0; half_n /= 2) {
        if (lid < half_n) {
            const float other = scratch[lid + half_n];
            scratch[lid] = is_max ? fmax(scratch[lid], other) : scratch[lid] + other;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float result = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE); /* the scratch is free again */
    return result;
}

/* q . k_j for the query in local memory `qs` and key row `at` of k. */
inline float key_dot(__local const float *qs, __global const CAT(storage_, K_T) * k, IDX at,
                     IDX k_s3) {
#if VEC > 1
    floatV dot = 0.0f;
    for (int c = 0; c < HEAD_DIM / VEC; ++c)
        dot = fma(CAT(vload, VEC)(c, qs), LOAD_LANES(K_T, k, at + (IDX)(c * VEC) * k_s3, k_s3),
                  dot);
    return hsum(dot);
#else
    float dot = 0.0f;
    for (int d = 0; d < HEAD_DIM; ++d)
        dot = fma(qs[d], CAT(load_, K_T)(k, at + (IDX)d * k_s3), dot);
    return dot;
#endif
}

#if VEC > 1
/* attention_keys' p.v: work-item t takes value chunk t % V_CHUNKS (VEC dims) over the keys
 * t / V_CHUNKS, + keys_pv_lanes(), ... : a V row is read by V_CHUNKS consecutive work-items,
 * one vector each, and keys_pv_lanes() key lanes run side by side (not one key after another
 * for the whole group). Lane kl's sums land in sums[kl * VALUE_DIM + e], which the caller adds
 * in lane order after the barrier here (a fixed order: deterministic). */
#define V_CHUNKS (VALUE_DIM / VEC)
#define KEYS_PV_FLOATS (KEYS_GROUP * VEC > VALUE_DIM ? KEYS_GROUP * VEC : VALUE_DIM)
inline int keys_pv_lanes(void) {
    return max(1, (int)get_local_size(0) / V_CHUNKS);
}

inline void keys_pv_partials(TENSOR_PARAMS(V_T, v), int b, int hk, int first, int count,
                             __local const float *scores, __local float *sums) {
    const int lanes = keys_pv_lanes();
    for (int t = (int)get_local_id(0); t < lanes * V_CHUNKS; t += (int)get_local_size(0)) {
        const int c = t % V_CHUNKS, kl = t / V_CHUNKS;
        floatV acc = 0.0f;
        for (int jj = kl; jj < count; jj += lanes)
            if (scores[jj] != 0.0f)
                acc = fma((floatV)scores[jj],
                          LOAD_LANES(V_T, v, AT(v, b, hk, first + jj, c * VEC), v_s3), acc);
        CAT(vstore, VEC)(acc, t, sums);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#endif

__kernel void attention_keys(TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(K_T, k), TENSOR_PARAMS(V_T, v),
                             __global CAT(storage_, O_T) * o, IDX o_off, IDX o_s0, IDX o_s1,
                             IDX o_s2, IDX o_s3, int B, int Hq, int Hkv, int Sq,
                             int Sk LSE_PARAMS PART_PARAMS, MASK_PARAMS) {
    __local float qs[HEAD_DIM], scores[KEYS_CHUNK], scratch[KEYS_GROUP];
#if VEC > 1
    __local float sums[KEYS_PV_FLOATS];
#endif
    const int lid = (int)get_local_id(0), n = (int)get_local_size(0);
    const int group = (int)get_group_id(0), split = group % SPLITS, row = group / SPLITS;
    const int i = row % Sq, bh = row / Sq, h = bh % Hq, b = bh / Hq, hk = h / (Hq / Hkv);
    MASK_PACK(p);
    mask_row r = mask_row_start(&p, b, h, i, Sq, Sk);
    CLIP_TO_SPLIT(r, split);
    const int first = r.lo, count = r.hi - r.lo; /* count <= KEYS_CHUNK: the host splits */
    for (int d = lid; d < HEAD_DIM; d += n) qs[d] = CAT(load_, Q_T)(q, AT(q, b, h, i, d));
    barrier(CLK_LOCAL_MEM_FENCE);

    /* the scores, a key per work-item at a time, and their maximum */
    float my_max = -INFINITY, my_nan = 0.0f;
    for (int jj = lid; jj < count; jj += n) {
        const int j = first + jj;
        const float s = mask_score(&p, &r, j, key_dot(qs, k, AT(k, b, hk, j, 0), k_s3));
        scores[jj] = s;
        my_max = fmax(my_max, s);
        my_nan = isnan(s) ? 1.0f : my_nan;
    }
    const float m = group_reduce(scratch, my_max, 1);
    const int nan_seen = group_reduce(scratch, my_nan, 1) > 0.0f;
    /* the weights in place (each work-item its own keys), and their sum */
    float my_sum = 0.0f;
    for (int jj = lid; jj < count; jj += n) {
        const float w = scores[jj] == -INFINITY ? 0.0f : exp(scores[jj] - m);
        scores[jj] = w;
        my_sum += w;
    }
    const float l = group_reduce(scratch, my_sum, 0); /* its barriers publish the weights */

    /* p.v; a zero weight skips its row (invisible rows may hold NaN or Inf) */
#if VEC > 1
    keys_pv_partials(v, v_off, v_s0, v_s1, v_s2, v_s3, b, hk, first, count, scores, sums);
#endif
    for (int e = lid; e < VALUE_DIM; e += n) {
#if VEC > 1
        float acc = 0.0f;
        for (int kl = 0; kl < keys_pv_lanes(); ++kl) acc += sums[kl * VALUE_DIM + e];
#else
        float acc = 0.0f;
        for (int jj = 0; jj < count; ++jj)
            if (scores[jj] != 0.0f)
                acc = fma(scores[jj], CAT(load_, V_T)(v, AT(v, b, hk, first + jj, e)), acc);
#endif
#if SPLIT
        __global float *at = part + ((IDX)row * SPLITS + split) * (VALUE_DIM + 2);
        at[2 + e] = acc;
        if (e == 0) at[0] = nan_seen ? NAN : m, at[1] = l;
#else
        const bool empty = m == -INFINITY && !nan_seen;
        const float value = empty ? EMPTY_VALUE : nan_seen ? NAN : acc / l;
        CAT(store_, O_T)(o, AT(o, b, h, i, e), value);
        if (e == 0) STORE_LSE(i, empty ? -INFINITY : nan_seen ? NAN : m + log(l));
#endif
    }
}

#endif /* BUILDS(2) */

#if VEC >= 4 && BUILDS(3)
/* K of every (batch, kv head) in tiles of VEC keys, each tile HEAD_DIM x VEC floats, d-major:
 * packed[((bh * tiles + tile) * HEAD_DIM + d) * VEC + e] = k[b, h, tile * VEC + e, d], 0 past
 * the batch's key length (no query sees those keys, and they may hold anything). A work-item
 * per (bh, tile, d); O(Sk * HEAD_DIM) work against attention's O(Sq * Sk * HEAD_DIM). */
__kernel void attention_pack_keys(TENSOR_PARAMS(K_T, k), __global float *packed, IDX packed_off,
                                  int B, int Hkv, int Sk, MASK_PARAMS) {
    const int tiles = (Sk + VEC - 1) / VEC;
    const IDX item = (IDX)get_global_id(0);
    if (item >= (IDX)B * Hkv * tiles * HEAD_DIM) return;
    const int d = (int)(item % HEAD_DIM), tile = (int)(item / HEAD_DIM % tiles);
    const int bh = (int)(item / HEAD_DIM / tiles), h = bh % Hkv, b = bh / Hkv;
    MASK_PACK(p);
    const int keys = mask_key_length(&p, b, Sk);
    __global float *out = packed + packed_off + item * VEC;
    for (int e = 0; e < VEC; ++e) {
        const int j = tile * VEC + e;
        out[e] = j < keys ? CAT(load_, K_T)(k, AT(k, b, h, j, d)) : 0.0f;
    }
}

/* Lane vectors of V row `at` in chunks of PV_CHUNK (p.v keeps BM x PV_CHUNK accumulators in
 * registers while it walks a tile's VEC rows): the largest of 4, 3, 2, 1 dividing the row. */
#define V_LANES  LANES(VALUE_DIM)
#define PV_CHUNK (V_LANES % 4 == 0 ? 4 : V_LANES % 3 == 0 ? 3 : V_LANES % 2 == 0 ? 2 : 1)

/* Lanes c * VEC .. c * VEC + VEC - 1 of the V row starting at `at`. */
inline floatV value_lanes(__global const CAT(storage_, V_T) * v, IDX at, IDX stride, int c) {
    if (stride == 1) return CAT(CAT(load, VEC), CAT(_, V_T))(v, at + (IDX)(c * VEC));
    float lanes[VEC];
    for (int e = 0; e < VEC; ++e) lanes[e] = CAT(load_, V_T)(v, at + (IDX)(c * VEC + e) * stride);
    return CAT(vload, VEC)(0, lanes);
}

/* The masked scores of keys j0 .. j0 + VEC - 1 for one query row, from their raw dots x. A tile
 * that ends past Sk is masked key by key, so that no mask tensor is read past its end. */
inline floatV lanes_mask(const mask_params *p, const mask_row *r, int j0, int Sk, floatV x) {
    if (j0 + VEC <= Sk) return mask_chunk_score(p, r, j0, x);
    float lanes[VEC];
    CAT(vstore, VEC)(x, 0, lanes);
    for (int e = 0; e < VEC; ++e)
        lanes[e] = j0 + e < Sk ? mask_score(p, r, j0 + e, lanes[e]) : -INFINITY;
    return CAT(vload, VEC)(0, lanes);
}

/* Loops over the block's rows and lane vectors are UNROLLed (common.cl), so that the score tile
 * and the accumulators live in registers. */

/* The key tiles a step of attention_lanes takes (LANE_TILES tiles of VEC keys, a tuning
 * parameter): each q element it broadcasts feeds that many FMAs, and a row's maximum and rescale
 * come once a step. */
#ifndef LANE_TILES
#define LANE_TILES 2
#endif
#define SPAN (LANE_TILES * VEC)

/* acc[t] += pr[t][jj] * V row j0 + jj over the step's rows below hi, PV_CHUNK lane vectors at a
 * time; LOAD_LANES(at, cc) loads lane vector c0 + cc of the row at `at`, and a row t takes key
 * jj only where TAKES holds. */
#define PV_TILE(LOAD_LANES, TAKES)                                                                 \
    UNROLL for (int c0 = 0; c0 < V_LANES; c0 += PV_CHUNK) {                                       \
        for (int jj = 0; jj < SPAN && j0 + jj < hi; ++jj) {                                        \
            const IDX at = AT(v, b, hk, j0 + jj, 0);                                              \
            floatV vv[PV_CHUNK];                                                                   \
            UNROLL for (int cc = 0; cc < PV_CHUNK; ++cc) {                                         \
                vv[cc] = LOAD_LANES;                                                               \
            }                                                                                      \
            UNROLL for (int t = 0; t < BM; ++t) {                                                  \
                if (!(TAKES)) continue;                                                            \
                const floatV w = (floatV)pr[t][jj];                                                \
                UNROLL for (int cc = 0; cc < PV_CHUNK; ++cc) {                                     \
                    acc[t][c0 + cc] = fma(w, vv[cc], acc[t][c0 + cc]);                             \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

__attribute__((reqd_work_group_size(1, 1, 1))) __kernel void
attention_lanes(TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(K_T, k), TENSOR_PARAMS(V_T, v),
                __global CAT(storage_, O_T) * o, IDX o_off, IDX o_s0, IDX o_s1, IDX o_s2, IDX o_s3,
                int B, int Hq, int Hkv, int Sq, int Sk LSE_PARAMS PART_PARAMS,
                __global const float *packed, IDX packed_off, MASK_PARAMS) {
    const int blocks = (Sq + BM - 1) / BM;
    const int item = (int)get_global_id(0);
    if (item >= B * Hq * blocks * SPLITS) return;
    const int split = item % SPLITS, unit = item / SPLITS;
    const int i0 = (unit % blocks) * BM, bh = unit / blocks, h = bh % Hq, b = bh / Hq;
    const int hk = h / (Hq / Hkv), tiles = (Sk + VEC - 1) / VEC;
    __global const float *kp = packed + packed_off + (IDX)(b * Hkv + hk) * tiles * VEC * HEAD_DIM;
    MASK_PACK(p);

    /* the block's queries: their masks, their elements (broadcast one at a time), their running
     * softmax state */
    mask_row r[BM];
    float qs[BM][HEAD_DIM], m[BM], l[BM];
    floatV acc[BM][V_LANES];
    int nan_seen[BM];
    int lo = Sk, hi = 0;
    UNROLL for (int t = 0; t < BM; ++t) {
        const int i = min(i0 + t, Sq - 1); /* rows past Sq repeat the last one, unwritten */
        r[t] = mask_row_start(&p, b, h, i, Sq, Sk);
        CLIP_TO_SPLIT(r[t], split);
        if (i0 + t >= Sq) r[t].hi = r[t].lo, r[t].end = r[t].start; /* and see nothing */
        lo = min(lo, r[t].lo);
        hi = max(hi, r[t].hi);
        /* a row that sees no key is never read: it may hold anything */
        const bool sees = r[t].lo < r[t].hi;
        for (int d = 0; d < HEAD_DIM; ++d)
            qs[t][d] = sees ? CAT(load_, Q_T)(q, AT(q, b, h, i, d)) : 0.0f;
        UNROLL for (int c = 0; c < V_LANES; ++c) acc[t][c] = 0.0f;
        m[t] = -INFINITY;
        l[t] = 0.0f;
        nan_seen[t] = 0;
    }

    for (int j0 = lo / VEC * VEC; j0 < hi; j0 += SPAN) {
        /* the raw scores: BM x SPAN dots as LANE_TILES x BM x HEAD_DIM vector FMAs; a tile at or
         * past hi reads the first again (its scores are masked) */
        __global const float *tile[LANE_TILES];
        UNROLL for (int u = 0; u < LANE_TILES; ++u) {
            tile[u] = kp + (IDX)(j0 + u * VEC < hi ? j0 + u * VEC : j0) * HEAD_DIM;
        }
        floatV s[LANE_TILES][BM];
        UNROLL for (int u = 0; u < LANE_TILES; ++u) UNROLL for (int t = 0; t < BM; ++t) {
            s[u][t] = 0.0f;
        }
        for (int d = 0; d < HEAD_DIM; ++d) {
            floatV kd[LANE_TILES];
            UNROLL for (int u = 0; u < LANE_TILES; ++u) kd[u] = CAT(vload, VEC)(d, tile[u]);
            UNROLL for (int t = 0; t < BM; ++t) {
                const floatV qd = (floatV)qs[t][d];
                UNROLL for (int u = 0; u < LANE_TILES; ++u) s[u][t] = fma(qd, kd[u], s[u][t]);
            }
        }
        /* masked, and the online softmax: a rescale only when a row's maximum grows */
        float pr[BM][SPAN];
        bool dense = true; /* every row sees every key of the step below hi */
        UNROLL for (int t = 0; t < BM; ++t) {
            floatV x[LANE_TILES];
            float top = m[t];
            UNROLL for (int u = 0; u < LANE_TILES; ++u) {
                const int ju = j0 + u * VEC;
                x[u] = (floatV)(-INFINITY);
                if (ju < r[t].hi && ju + VEC > r[t].lo) x[u] = lanes_mask(&p, &r[t], ju, Sk, s[u][t]);
                dense = dense && (ju >= hi || all(x[u] != (floatV)(-INFINITY)));
                nan_seen[t] |= any(isnan(x[u]));
                top = fmax(top, hmax(x[u]));
            }
            if (top > m[t]) {
                const float keep = exp(m[t] - top);
                l[t] *= keep;
                UNROLL for (int c = 0; c < V_LANES; ++c) acc[t][c] *= keep;
                m[t] = top;
            }
            UNROLL for (int u = 0; u < LANE_TILES; ++u) {
                const floatV e =
                    select(exp(x[u] - top), (floatV)0.0f, x[u] == (floatV)(-INFINITY));
                l[t] += hsum(e);
                CAT(vstore, VEC)(e, u, pr[t]);
            }
        }
        /* acc += p v. A step some row cannot see all of skips that row's zero weights, so that
         * whatever an invisible V row holds (NaN, Inf) never reaches acc */
        if (dense && v_s3 == 1) {
            PV_TILE(CAT(CAT(load, VEC), CAT(_, V_T))(v, at + (IDX)((c0 + cc) * VEC)), true)
        } else {
            PV_TILE(value_lanes(v, at, v_s3, c0 + cc), pr[t][jj] != 0.0f)
        }
    }

    /* through a copy: a variable index into acc would keep it out of registers */
    UNROLL for (int t = 0; t < BM; ++t) {
        floatV row[V_LANES];
        UNROLL for (int c = 0; c < V_LANES; ++c) row[c] = acc[t][c];
        if (i0 + t < Sq) STORE_RESULT(i0 + t, row, m[t], l[t], nan_seen[t]);
    }
}
#endif /* VEC >= 4 && BUILDS(3) */

#if (BUILDS(5) || BUILDS(6)) && defined(MMA_T)
#ifndef CLATTN_MMA_CL
#include "mma.cl"
#endif
/* What attention_mma and attention_units share: a work-group of MMA_WARPS subgroups (warps)
 * of MMA_SG work-items, MMA_WQ queries a subgroup, key tiles of MMA_KT keys fetched from global
 * memory into registers (a tile ahead with MMA_AHEAD, 16-byte loads when the host proved K's and
 * V's rows ALIGNED) and staged in local memory as raw 16-bit rows, V's NaN and Inf as 0, as the
 * group's q rows are at the start (attention_mma with MMA_ASYNC copies them into local memory
 * instead: mma_copy_tile below). */
#ifndef MMA_WARPS
#define MMA_WARPS 4
#endif
#ifndef MMA_KT
#define MMA_KT 16 /* keys a tile: 16, 32 or 64 */
#endif
#ifndef MMA_WQ
#define MMA_WQ 16 /* queries a warp: 16 or 32 */
#endif
#ifndef MMA_AHEAD
#define MMA_AHEAD 1 /* 1: the next tile fetched into registers during this one; 0: at the tile */
#endif
#define MMA_BQ    (MMA_WQ * MMA_WARPS)    /* queries a group */
/* q, k and v as raw bits: 16-bit values, or with MMA_T f32 (attention_mma's 3xTF32 products)
 * 32-bit ones; MMA_PER_WORD values a 32-bit word of the local tiles, MMA_CHUNK a 16-byte chunk of
 * the loads and copies. */
#if MMA_T_IS_F32
typedef uint mma_raw;
#define MMA_PER_WORD 1
#else
typedef ushort mma_raw;
#define MMA_PER_WORD 2
#endif
#define MMA_CHUNK  (4 * MMA_PER_WORD)
#define MMA_RAW(p) ((__global const mma_raw *)(p))
/* Row strides, in 32-bit words, of the local tiles of K and V (both row-major, a row a key):
 * 4 mod 32, so that the eight 16-byte rows of an 8 x 8 block that a fragment load reads hit
 * distinct banks, and rows stay 16-byte aligned for the loads and the stores. f32 (n a multiple
 * of 8): 4 mod 8 is enough for the 32 words of a tf32 fragment (8 rows g by 4 columns t, or V's
 * 4 rows 2t by 8 columns g) to hit 32 banks, and pads less. */
#if MMA_T_IS_F32
#define MMA_STRIDE(n) ((n) / 8 * 8 + 4)
#else
#define MMA_STRIDE(n) (((n) / 2 + 31) / 32 * 32 + 4)
#endif
#define MMA_KS        MMA_STRIDE(HEAD_DIM)
#define MMA_VS        MMA_STRIDE(VALUE_DIM)

/* The 16-bit bits of v in MMA_T, rounded to nearest even. */
inline uint mma_bits(float v) {
#if MMA_T_IS_BF16
    return bf16_from_f32(v);
#else
    ushort h;
    vstore_half(v, 0, (__private half *)&h);
    return h;
#endif
}

/* A raw value is NaN or Inf: its exponent bits are all ones. */
inline bool mma_not_finite(uint bits) {
    return MMA_T_IS_F32    ? (bits & 0x7f800000u) == 0x7f800000u
           : MMA_T_IS_BF16 ? (bits & 0x7f80u) == 0x7f80u
                           : (bits & 0x7c00u) == 0x7c00u;
}

/* A raw value as a float. */
inline float mma_raw_value(uint bits) {
#if MMA_T_IS_F32
    return as_float(bits);
#else
    return mma_half_value(bits, 0);
#endif
}

/* A word of two 16-bit values (one f32) with NaN and Inf as 0; `bad` set when it held one. */
inline uint mma_finite_word(uint w, int *bad) {
#if MMA_T_IS_F32
    *bad |= mma_not_finite(w);
    return mma_not_finite(w) ? 0u : w;
#else
    const bool lo = mma_not_finite(w & 0xffffu), hi = mma_not_finite(w >> 16);
    *bad |= lo || hi;
    return (lo ? 0u : w & 0xffffu) | (hi ? 0u : w & 0xffff0000u);
#endif
}

/* Any of the values of x is NaN or Inf: per value, its exponent bits plus the exponent's lowest
 * bit carry into the value's top bit only when they are all ones. */
inline bool mma_any_not_finite(uint4 x) {
    const uint exponent = MMA_T_IS_F32 ? 0x7f800000u : MMA_T_IS_BF16 ? 0x7f807f80u : 0x7c007c00u;
    const uint lowest = MMA_T_IS_F32 ? 0x00800000u : MMA_T_IS_BF16 ? 0x00800080u : 0x04000400u;
    const uint top = MMA_T_IS_F32 ? 0x80000000u : 0x80008000u;
    const uint4 carried = (x & exponent) + lowest;
    return ((carried.s0 | carried.s1 | carried.s2 | carried.s3) & top) != 0u;
}

/* The rows of one (batch, head) of a [B, H, S, n] tensor of 16-bit values: value d of row j
 * at p[at + j * row + d * step]. */
typedef struct mma_matrix {
    __global const mma_raw *p;
    IDX at, row, step;
} mma_matrix;

#define MMA_MATRIX(x, b, h) mma_matrix_at(MMA_RAW(x), AT(x, b, h, 0, 0), x##_s2, x##_s3)
MMA_INLINE mma_matrix mma_matrix_at(__global const mma_raw *p, IDX at, IDX row, IDX step) {
    mma_matrix m;
    m.p = p, m.at = at, m.row = row, m.step = step;
    return m;
}

/* A tile's K and V in 16-byte chunks (uint4), MMA_KREGS and MMA_VREGS a work-item: fetched from
 * global memory into registers, a tile ahead with MMA_AHEAD (the loads fly while the last tile
 * is computed, in registers held throughout) or at the tile, then staged into local memory (or,
 * with MMA_ASYNC, copied there: the same chunks, no register). */
#define MMA_THREADS (MMA_WARPS * MMA_SG)
#define MMA_KCHUNKS (MMA_KT * HEAD_DIM / MMA_CHUNK)
#define MMA_VCHUNKS (MMA_KT * VALUE_DIM / MMA_CHUNK)
#define MMA_KREGS   ((MMA_KCHUNKS + MMA_THREADS - 1) / MMA_THREADS)
#define MMA_VREGS   ((MMA_VCHUNKS + MMA_THREADS - 1) / MMA_THREADS)
/* Chunk e of a tile of rows of n values: its row and first value. */
#define MMA_CHUNK_ROW(e, n) ((e) / ((n) / MMA_CHUNK))
#define MMA_CHUNK_AT(e, n)  ((e) % ((n) / MMA_CHUNK) * MMA_CHUNK)

/* Values d .. d + MMA_CHUNK - 1 of row j of x (0 at or past hi), value by value. */
MMA_INLINE uint4 mma_chunk_by_value(const mma_matrix *x, int j, int d, int hi) {
    if (j >= hi) return (uint4)0u;
    const IDX at = x->at + (IDX)j * x->row + (IDX)d * x->step;
    uint w[4];
    UNROLL for (int i = 0; i < 4; ++i)
#if MMA_T_IS_F32
        w[i] = x->p[at + (IDX)i * x->step];
#else
        w[i] = (uint)x->p[at + (IDX)(2 * i) * x->step] |
               (uint)x->p[at + (IDX)(2 * i + 1) * x->step] << 16;
#endif
    return (uint4)(w[0], w[1], w[2], w[3]);
}

/* The same for K and V: one 16-byte load where the host proved their rows ALIGNED. */
MMA_INLINE uint4 mma_chunk(const mma_matrix *x, int j, int d, int hi) {
#if ALIGNED
    if (j >= hi) return (uint4)0u;
    return *(__global const uint4 *)(x->p + x->at + (IDX)j * x->row + (IDX)d);
#else
    return mma_chunk_by_value(x, j, d, hi);
#endif
}

/* Keys j0 .. j0 + MMA_KT - 1 (0 at or past hi) of K and V into the registers kr and vr. */
MMA_INLINE void mma_fetch(const mma_matrix *k, const mma_matrix *v, int j0, int hi,
                          uint4 kr[MMA_KREGS], uint4 vr[MMA_VREGS]) {
    const int lid = (int)get_local_id(0);
    UNROLL for (int i = 0; i < MMA_KREGS; ++i) {
        const int e = lid + i * MMA_THREADS;
        if (e < MMA_KCHUNKS)
            kr[i] = mma_chunk(k, j0 + MMA_CHUNK_ROW(e, HEAD_DIM), MMA_CHUNK_AT(e, HEAD_DIM), hi);
    }
    UNROLL for (int i = 0; i < MMA_VREGS; ++i) {
        const int e = lid + i * MMA_THREADS;
        if (e < MMA_VCHUNKS)
            vr[i] = mma_chunk(v, j0 + MMA_CHUNK_ROW(e, VALUE_DIM), MMA_CHUNK_AT(e, VALUE_DIM), hi);
    }
}

/* The fetched chunks into kt and vt (row-major, MMA_PER_WORD values a word; V's NaN and Inf as
 * 0); `garbage` set when a value was one. */
MMA_INLINE void mma_stage(const uint4 kr[MMA_KREGS], const uint4 vr[MMA_VREGS], __local uint *kt,
                          __local uint *vt, __local int *garbage) {
    const int lid = (int)get_local_id(0);
    int bad = 0;
    UNROLL for (int i = 0; i < MMA_KREGS; ++i) {
        const int e = lid + i * MMA_THREADS, jj = MMA_CHUNK_ROW(e, HEAD_DIM);
        if (e < MMA_KCHUNKS)
            *(__local uint4 *)(kt + jj * MMA_KS + MMA_CHUNK_AT(e, HEAD_DIM) / MMA_PER_WORD) = kr[i];
    }
    UNROLL for (int i = 0; i < MMA_VREGS; ++i) {
        const int e = lid + i * MMA_THREADS, jj = MMA_CHUNK_ROW(e, VALUE_DIM);
        if (e >= MMA_VCHUNKS) continue;
        const uint4 x = (uint4)(mma_finite_word(vr[i].s0, &bad), mma_finite_word(vr[i].s1, &bad),
                                mma_finite_word(vr[i].s2, &bad), mma_finite_word(vr[i].s3, &bad));
        *(__local uint4 *)(vt + jj * MMA_VS + MMA_CHUNK_AT(e, VALUE_DIM) / MMA_PER_WORD) = x;
    }
    if (bad) atomic_or(garbage, 1);
}

/* The tile at j0 (keys below hi) staged into kt and vt once the group is done with the last one,
 * and (MMA_AHEAD) the next one fetched into kr and vr; whether the tile held a NaN or Inf value.
 * `garbage` holds a flag by the tile's parity: one is reset while the other is in use. */
MMA_INLINE bool mma_next_tile(const mma_matrix *k, const mma_matrix *v, int j0, int hi, int tile,
                              uint4 kr[MMA_KREGS], uint4 vr[MMA_VREGS], __local uint *kt,
                              __local uint *vt, __local int *garbage) {
    if (!MMA_AHEAD) mma_fetch(k, v, j0, hi, kr, vr);
    barrier(CLK_LOCAL_MEM_FENCE); /* everyone is done with the last tile */
    mma_stage(kr, vr, kt, vt, &garbage[tile]);
    barrier(CLK_LOCAL_MEM_FENCE);
    const bool flagged = garbage[tile] != 0;
    if (get_local_id(0) == 0) garbage[tile ^ 1] = 0; /* everyone read it, a tile ago */
    if (MMA_AHEAD && j0 + MMA_KT < hi) mma_fetch(k, v, j0 + MMA_KT, hi, kr, vr);
    return flagged;
}

/* The group's q rows (first .. first + MMA_BQ - 1, 0 at or past Sq) into qt, rows as K's tiles
 * are staged, value by value (ALIGNED speaks of K and V only; this runs once a group). They stay
 * there, not in registers: a warp reads its A fragments again for each tile, and the registers
 * they would hold let more groups share a multiprocessor. */
MMA_INLINE void mma_stage_q(const mma_matrix *q, int first, int Sq, __local uint *qt) {
    for (int e = (int)get_local_id(0); e < MMA_BQ * HEAD_DIM / MMA_CHUNK; e += MMA_THREADS) {
        const int i = MMA_CHUNK_ROW(e, HEAD_DIM), d = MMA_CHUNK_AT(e, HEAD_DIM);
        *(__local uint4 *)(qt + i * MMA_KS + d / MMA_PER_WORD) =
            mma_chunk_by_value(q, first + i, d, Sq);
    }
}

/* Row `row`'s mask (cl/mask.cl) in batch b and head h; a row past Sq sees nothing (it only
 * helps load tiles). */
MMA_INLINE mask_row mma_row_mask(const mask_params *p, int b, int h, int row, int Sq, int Sk) {
    mask_row r = mask_row_start(p, b, h, min(row, Sq - 1), Sq, Sk);
    if (row >= Sq) r.hi = r.lo;
    return r;
}
#endif /* (BUILDS(5) || BUILDS(6)) && MMA_T */

#if BUILDS(5) && defined(MMA_T)
/* attention_mma: q, k and v in MMA_T (f16 or bf16), products on cl/mma.cl's mma_m16n8k16 (MMA_T
 * f32: its mma_m16n8k8x3, 3xTF32, with the differences told at mma_scores and mma_values). A
 * work-group of MMA_WARPS warps takes MMA_WQ * MMA_WARPS queries of one (batch, query head), a
 * warp MMA_WQ of them as MMA_MT m-tiles of 16; each lane holds rows g and g + 8 of each m-tile
 * (g = lane / 4, t = lane % 4), in the fragment layouts of cl/mma.cl, so a K or V fragment read
 * from local memory feeds MMA_MT products. Per tile of MMA_KT keys (K and V copied into one of
 * two local buffers during the last tile with MMA_ASYNC, else fetched into registers, a tile
 * ahead with MMA_AHEAD, and staged in local memory; 16-byte loads or copies when the host proved
 * their rows ALIGNED; raw 16-bit rows, as the group's q rows are at the start, from which
 * cl/mma.cl's mma_load_blocks, ldmatrix on the units, reads the fragments): S = q k^T as
 * MMA_KB blocks of 16 x 8 products per 16 head dims and m-tile, the mask and the online softmax
 * in f32 (a row's max combined across the four lanes that hold it: cl/mma.cl's quad reduction),
 * then the weights, rounded to MMA_T, re-packed in registers as the A fragments of P V (the C
 * fragments of two 8-key blocks are exactly one A fragment's halves) and multiplied into
 * VALUE_DIM / 8 accumulator fragments per m-tile.
 * Everything the other variants promise holds (masks, GQA, lse, empty rows, bottom-right): the
 * mask is cl/mask.cl's, element by element except in tiles that it leaves whole (then the scale
 * alone, the same bits). The weights are exp2((s - m) log2(e)) (mma_weight): the base-2
 * exponential is the cheaper instruction (FlashAttention folds m log2(e) into one FMA, which
 * overflows for |m| > 2.3e38). Key tiles start at multiples of MMA_KT, whatever the group's
 * span. A zero weight cannot skip its V row inside a product (0 * Inf is NaN), so NaN and Inf
 * values enter the products as 0, and a tile that holds one (a flag set while staging) adds
 * them afterwards to the outputs whose weight for them is not 0 (w * x is x's infinity or NaN
 * for any w > 0, so only the weight's being 0 matters): a hidden one changes no bit. A NaN score
 * makes its row's sum NaN, which is how the end finds NaN rows. Needs HEAD_DIM a multiple of 16
 * and VALUE_DIM of 8 (the host checks). With SPLIT, each group takes a chunk of the keys (the
 * rows' masks clipped to it) and leaves its rows' shares for attention_merge. */
#define MMA_MT    (MMA_WQ / 16)           /* m-tiles a warp */
#define MMA_ROWS  (2 * MMA_MT)            /* rows a lane: row a is g + 8 (a % 2) of m-tile a / 2 */
#define MMA_KB    (MMA_KT / 8)            /* 8-key blocks of S */
#define MMA_QC    (HEAD_DIM / 16)         /* 16-dim A fragments of q, per m-tile (16-bit) */
#define MMA_VB        (VALUE_DIM / 8) /* 8-column blocks of the output */

/* The warp's row (0 .. MMA_WQ - 1) that is the lane's row a: g + 8 (a % 2) of m-tile a / 2. */
inline int mma_lane_row(int a) {
    return 16 * (a / 2) + 8 * (a % 2) + (int)get_local_id(0) % MMA_WARP / 4;
}

#if MMA_T_IS_F32
/* The score of the warp's q row `row` and key `key` of the staged tile in plain f32 FMAs. */
MMA_INLINE float mma_score_plain(const __local uint *qt, const __local uint *kt, int row, int key) {
    const __local float *x = (const __local float *)qt + row * MMA_KS;
    const __local float *y = (const __local float *)kt + key * MMA_KS;
    float dot = 0.0f;
    for (int d = 0; d < HEAD_DIM; ++d) dot = fma(x[d], y[d], dot);
    return dot;
}

/* S = q k^T over the staged tile (s as below) in 3xTF32 products, 8 head dims at a time: the
 * warp's q rows give an A fragment per m-tile, K's rows a B fragment per 8-key block (K stored
 * n-major: b[r] = K[8 kb + g][d + t + 4r]), each split once and read once for the warp's MMA_MT
 * m-tiles. A score with an operand the split cannot take (NaN, Inf, or within 2^-12 of f32's
 * largest, whose big part rounds past it) comes out NaN or Inf, and so does
 * one that overflows f32: each of those is taken again in plain f32, which gives what the other
 * variants give (an Inf times a small part of 0 would make NaN where f32 makes Inf), and the
 * tile's other scores keep their bits. */
MMA_INLINE void mma_scores(const __local uint *qt, const __local uint *kt,
                           float s[MMA_MT][MMA_KB][4], __local float *scratch) {
    const int lane = (int)get_local_id(0) % MMA_WARP, g = lane / 4, t = lane % 4;
    UNROLL for (int mt = 0; mt < MMA_MT; ++mt)
        UNROLL for (int kb = 0; kb < MMA_KB; ++kb)
            UNROLL for (int f = 0; f < 4; ++f) s[mt][kb][f] = 0.0f;
    MMA_UNROLL for (int d = 0; d < HEAD_DIM; d += 8) {
        uint q_big[MMA_MT][4], q_small[MMA_MT][4];
        UNROLL for (int mt = 0; mt < MMA_MT; ++mt)
            UNROLL for (int r = 0; r < 4; ++r) {
                const int row = 16 * mt + g + (r & 1) * 8, col = d + t + (r >> 1) * 4;
                mma_tf32_split(as_float(qt[row * MMA_KS + col]), &q_big[mt][r], &q_small[mt][r], 1);
            }
        MMA_UNROLL for (int kb = 0; kb < MMA_KB; ++kb) {
            uint k_big[2], k_small[2];
            UNROLL for (int r = 0; r < 2; ++r)
                mma_tf32_split(as_float(kt[(8 * kb + g) * MMA_KS + d + t + 4 * r]), &k_big[r],
                               &k_small[r], 1);
            MMA_UNROLL for (int mt = 0; mt < MMA_MT; ++mt)
                mma_m16n8k8x3(s[mt][kb], q_big[mt], q_small[mt], k_big, k_small, s[mt][kb],
                              scratch);
        }
    }
    UNROLL for (int mt = 0; mt < MMA_MT; ++mt)
        UNROLL for (int kb = 0; kb < MMA_KB; ++kb)
            UNROLL for (int f = 0; f < 4; ++f)
                if (!isfinite(s[mt][kb][f]))
                    s[mt][kb][f] = mma_score_plain(qt, kt, 16 * mt + g + (f >> 1) * 8,
                                                   8 * kb + 2 * t + (f & 1));
}
#else
/* S = q k^T over the staged tile: s[mt][kb][f] is row 2 mt + (f >> 1)'s score of key
 * 8 kb + 2t + (f & 1). The warp's q rows (qt: its MMA_WQ rows) give A fragments of four 8 x 8
 * blocks; K's B fragments for 8-key blocks kb and kb + 1 and 16 head dims are one load of four
 * blocks too (K stored n-major: untransposed), each read once for the warp's MMA_MT m-tiles. */
MMA_INLINE void mma_scores(const __local uint *qt, const __local uint *kt,
                           float s[MMA_MT][MMA_KB][4], __local float *scratch) {
    const __local ushort *q16 = (const __local ushort *)qt, *k16 = (const __local ushort *)kt;
    UNROLL for (int mt = 0; mt < MMA_MT; ++mt)
        UNROLL for (int kb = 0; kb < MMA_KB; ++kb)
            UNROLL for (int f = 0; f < 4; ++f) s[mt][kb][f] = 0.0f;
    UNROLL for (int c = 0; c < MMA_QC; ++c) {
        uint qa[MMA_MT][4]; /* rows g and g + 8 of m-tile mt, head dims 16c + 2t and 16c + 8 + 2t */
        UNROLL for (int mt = 0; mt < MMA_MT; ++mt) {
            const __local ushort *x = q16 + mt * 16 * (2 * MMA_KS) + c * 16,
                                 *y = x + 8 * 2 * MMA_KS;
            mma_load_blocks(qa[mt], x, y, x + 8, y + 8, 2 * MMA_KS, 0);
        }
        UNROLL for (int kb = 0; kb < MMA_KB; kb += 2) {
            const __local ushort *x = k16 + kb * 8 * (2 * MMA_KS) + c * 16, *y = x + 8 * 2 * MMA_KS;
            uint kf[4]; /* kf[0], kf[1]: block kb's fragment; kf[2], kf[3]: kb + 1's */
            mma_load_blocks(kf, x, x + 8, y, y + 8, 2 * MMA_KS, 0);
            UNROLL for (int mt = 0; mt < MMA_MT; ++mt) {
                mma_m16n8k16(s[mt][kb], qa[mt], kf, s[mt][kb], scratch);
                mma_m16n8k16(s[mt][kb + 1], qa[mt], kf + 2, s[mt][kb + 1], scratch);
            }
        }
    }
}
#endif



/* The tile's scores masked in place: the scale alone where each of the lane's rows sees the whole
 * tile plainly (`plain`), else key by key (-INFINITY outside a row's [lo, hi) and, with SPLIT,
 * outside the group's split_keys), with the rows' masks made again here: kept from the start,
 * they held registers through every tile. */
MMA_INLINE void mma_mask(const mask_params *p, int b, int h, const int rows[MMA_ROWS], int Sq,
                         int Sk, int2 split_keys, int j0, bool plain, float s[MMA_MT][MMA_KB][4]) {
    const int t = (int)get_local_id(0) % 4;
    if (plain) {
        UNROLL for (int mt = 0; mt < MMA_MT; ++mt)
            UNROLL for (int kb = 0; kb < MMA_KB; ++kb)
                UNROLL for (int f = 0; f < 4; ++f) s[mt][kb][f] *= p->scale;
        return;
    }
    UNROLL for (int a = 0; a < MMA_ROWS; ++a) {
        mask_row r = mma_row_mask(p, b, h, rows[a], Sq, Sk);
#if SPLIT
        mask_row_clip(&r, split_keys.x, split_keys.y);
#endif
        const int mt = a / 2, lower = a % 2; /* row g or g + 8 of m-tile mt */
        UNROLL for (int kb = 0; kb < MMA_KB; ++kb)
            UNROLL for (int e = 0; e < 2; ++e) {
                const int j = j0 + kb * 8 + 2 * t + e;
                const float x = s[mt][kb][lower * 2 + e];
                s[mt][kb][lower * 2 + e] =
                    j >= r.lo && j < r.hi ? mask_score(p, &r, j, x) : -INFINITY;
            }
    }
}

/* A weight, exp2(x) for x <= 0. On NVIDIA's units with f16 weights in a tile that holds no NaN
 * or Inf value: ex2.approx.ftz, the instruction that exp2 is built on there, without exp2's
 * steps for results below 2^-126: those weights round to 0 in f16 anyway, and each moves a
 * row's sum (at least 1 in the end: its max's weight) by less than 2^-126, far below its
 * rounding (the same bits but for a tie contrived at that depth). bf16 holds such weights, and
 * the non-finite values' test asks whether a weight is 0, so those keep exp2. */
MMA_INLINE float mma_weight(float x, bool flagged) {
#if MMA_PTX && !MMA_T_IS_BF16 && !MMA_T_IS_F32
    if (!flagged) {
        float w;
        MMA_ASM("ex2.approx.ftz.f32 %0, %1;" : "=f"(w) : "f"(x));
        return w;
    }
#endif
    (void)flagged;
    return exp2(x);
}

/* The online-softmax step over the tile's masked scores s, which become the weights, in place:
 * each row's max m (natural units) and sum l updated and acc rescaled. Where the tile holds NaN
 * or Inf values (`flagged`), seen[row * MMA_KT + key] records which weights are not 0. */
MMA_INLINE void mma_softmax(float s[MMA_MT][MMA_KB][4], float m[MMA_ROWS], float l[MMA_ROWS],
                            float acc[MMA_MT][MMA_VB][4], bool flagged, __local uchar *seen,
                            __local float *xs) {
    const int t = (int)get_local_id(0) % 4;
    float base[MMA_ROWS], top[MMA_ROWS];
    UNROLL for (int a = 0; a < MMA_ROWS; ++a) top[a] = -INFINITY;
    UNROLL for (int mt = 0; mt < MMA_MT; ++mt)
        UNROLL for (int kb = 0; kb < MMA_KB; ++kb)
            UNROLL for (int f = 0; f < 4; ++f)
                top[2 * mt + (f >> 1)] = fmax(top[2 * mt + (f >> 1)], s[mt][kb][f]);
    UNROLL for (int mt = 0; mt < MMA_MT; ++mt) mma_quad_reduce(top + 2 * mt, 1, xs);
    UNROLL for (int a = 0; a < MMA_ROWS; ++a) {
        const float m_new = fmax(m[a], top[a]);
        /* exp(x - m) as exp2((x - m) log2e), the cheaper instruction (x - m is exact or
         * rounded once, as before, and cannot overflow: m log2e could for |m| > 2.3e38); a row
         * that sees nothing yet keeps base 0, so its -INFINITY scores weigh 0. An unchanged max
         * keeps the row exactly (a tile the row does not see changes no bit), a first one
         * drops the empty start (exp2(-INFINITY)). */
        base[a] = m_new == -INFINITY ? 0.0f : m_new;
        const float keep = m[a] == m_new ? 1.0f : exp2((m[a] - m_new) * M_LOG2E_F);
        m[a] = m_new;
        l[a] *= keep;
        UNROLL for (int n = 0; n < MMA_VB; ++n)
            UNROLL for (int e = 0; e < 2; ++e) acc[a / 2][n][(a % 2) * 2 + e] *= keep;
    }
    UNROLL for (int mt = 0; mt < MMA_MT; ++mt)
        UNROLL for (int kb = 0; kb < MMA_KB; ++kb)
            UNROLL for (int f = 0; f < 4; ++f) {
                const int a = 2 * mt + (f >> 1);
                const float w = mma_weight((s[mt][kb][f] - base[a]) * M_LOG2E_F, flagged);
                l[a] += w;
                if (flagged) seen[mma_lane_row(a) * MMA_KT + kb * 8 + 2 * t + (f & 1)] = w != 0.0f;
                s[mt][kb][f] = w;
            }
}

#if MMA_T_IS_F32
/* acc += P V over the staged tile in 3xTF32 products, 8 keys at a time. The weights' C fragments
 * hold keys 2t and 2t + 1 of a block where an A fragment holds columns t and t + 4: the A
 * fragment takes them as they are, its column t being key 2t and t + 4 key 2t + 1, and V's B
 * fragments follow (b[r] = V[8 c + 2t + r][8 n + g], V stored k-major), so nothing moves between
 * lanes. V splits truncated: its values are any finite ones (NaN and Inf were staged as 0). */
MMA_INLINE void mma_values(const float w[MMA_MT][MMA_KB][4], const __local uint *vt,
                           float acc[MMA_MT][MMA_VB][4], __local float *scratch) {
    const int lane = (int)get_local_id(0) % MMA_WARP, g = lane / 4, t = lane % 4;
    MMA_UNROLL for (int c = 0; c < MMA_KB; ++c) {
        uint p_big[MMA_MT][4], p_small[MMA_MT][4];
        UNROLL for (int mt = 0; mt < MMA_MT; ++mt)
            UNROLL for (int r = 0; r < 4; ++r) /* a[r]: row g + 8 (r & 1), key 2t + (r >> 1) */
                mma_tf32_split(w[mt][c][(r & 1) * 2 + (r >> 1)], &p_big[mt][r], &p_small[mt][r], 1);
        MMA_UNROLL for (int n = 0; n < MMA_VB; ++n) {
            uint v_big[2], v_small[2];
            UNROLL for (int r = 0; r < 2; ++r)
                mma_tf32_split(as_float(vt[(8 * c + 2 * t + r) * MMA_VS + 8 * n + g]), &v_big[r],
                               &v_small[r], 0);
            MMA_UNROLL for (int mt = 0; mt < MMA_MT; ++mt)
                mma_m16n8k8x3(acc[mt][n], p_big[mt], p_small[mt], v_big, v_small, acc[mt][n],
                              scratch);
        }
    }
}
#else
/* acc += P V over the staged tile, the weights w rounded to MMA_T and re-packed as P's A
 * fragments (keys 16c .. 16c + 15: the C fragments of 8-key blocks 2c and 2c + 1 are its
 * halves). V's B fragments for 16 keys and 8-column blocks n and n + 1 are one load of four 8 x 8
 * blocks (V stored k-major: transposed; an odd last block loads its own two twice), each read
 * once for the warp's MMA_MT m-tiles. */
MMA_INLINE void mma_values(const float w[MMA_MT][MMA_KB][4], const __local uint *vt,
                           float acc[MMA_MT][MMA_VB][4], __local float *scratch) {
    uint pa[MMA_MT][MMA_KB / 2][4];
    UNROLL for (int mt = 0; mt < MMA_MT; ++mt)
        UNROLL for (int kb = 0; kb < MMA_KB; ++kb)
            UNROLL for (int h = 0; h < 2; ++h)
                pa[mt][kb / 2][(kb % 2) * 2 + h] =
                    mma_bits(w[mt][kb][h * 2]) | mma_bits(w[mt][kb][h * 2 + 1]) << 16;
    const __local ushort *v16 = (const __local ushort *)vt;
    UNROLL for (int c = 0; c < MMA_KB / 2; ++c)
        UNROLL for (int n = 0; n < MMA_VB; n += 2) {
            const __local ushort *x = v16 + c * 16 * (2 * MMA_VS) + n * 8, *y = x + 8 * 2 * MMA_VS;
            const int next = n + 1 < MMA_VB ? 8 : 0;
            uint vf[4]; /* vf[0], vf[1]: block n's fragment; vf[2], vf[3]: n + 1's */
            mma_load_blocks(vf, x, y, x + next, y + next, 2 * MMA_VS, 1);
            UNROLL for (int mt = 0; mt < MMA_MT; ++mt) {
                mma_m16n8k16(acc[mt][n], pa[mt][c], vf, acc[mt][n], scratch);
                if (n + 1 < MMA_VB)
                    mma_m16n8k16(acc[mt][n + 1], pa[mt][c], vf + 2, acc[mt][n + 1], scratch);
            }
        }
}
#endif

/* The NaN and Inf values of keys j0 .. (below hi) went into the products as 0: each lane adds
 * those its own outputs weigh (seen, the warp's rows), read again from V (a key's values once
 * for all the lane's rows), so a hidden one changes no bit of a row. */
MMA_INLINE void mma_add_non_finite(const mma_matrix *v, int j0, int hi, const __local uchar *seen,
                                   float acc[MMA_MT][MMA_VB][4]) {
    const int t = (int)get_local_id(0) % 4;
    for (int jj = 0; jj < MMA_KT && j0 + jj < hi; ++jj) {
        bool weighs[MMA_ROWS], any = false;
        UNROLL for (int a = 0; a < MMA_ROWS; ++a) {
            weighs[a] = seen[mma_lane_row(a) * MMA_KT + jj] != 0;
            any = any || weighs[a];
        }
        if (!any) continue;
        const IDX at = v->at + (IDX)(j0 + jj) * v->row;
        UNROLL for (int n = 0; n < MMA_VB; ++n)
            UNROLL for (int e = 0; e < 2; ++e) {
                const uint bits = v->p[at + (IDX)(n * 8 + 2 * t + e) * v->step];
                if (!mma_not_finite(bits)) continue;
                const float x = mma_raw_value(bits);
                UNROLL for (int a = 0; a < MMA_ROWS; ++a)
                    if (weighs[a]) acc[a / 2][n][(a % 2) * 2 + e] += x;
            }
    }
}

#ifndef MMA_ASYNC
#define MMA_ASYNC 0
#endif
/* MMA_ASYNC 1: key tiles double-buffered in local memory and copied there by mma_copy16 (cp.async
 * on the units) a tile ahead, with no register holding them: the next tile's copies fly while
 * this one is computed, and one barrier a tile serves both. */
#define MMA_BUFFERS (MMA_ASYNC ? 2 : 1)

/* Keys j0 .. j0 + MMA_KT - 1 of x's rows of n values (0 at or past hi) copied into `to`, rows
 * `stride` words apart, the work-item's chunks as mma_fetch takes them: 16-byte copies where the
 * host proved the rows ALIGNED. n and stride are constants, so the loop unrolls as mma_fetch's
 * on the units (PoCL's optimizer, given the emulation's f32 build, could not and said so). */
MMA_INLINE void mma_copy_rows(const mma_matrix *x, const int n, const int stride, int j0, int hi,
                              __local uint *to) {
    const int lid = (int)get_local_id(0), chunks = MMA_KT * n / MMA_CHUNK;
    MMA_UNROLL for (int i = 0; i < (chunks + MMA_THREADS - 1) / MMA_THREADS; ++i) {
        const int e = lid + i * MMA_THREADS, jj = MMA_CHUNK_ROW(e, n), d = MMA_CHUNK_AT(e, n);
        if (e >= chunks) continue;
        __local uint *at = to + jj * stride + d / MMA_PER_WORD;
        if (ALIGNED && j0 + jj < hi)
            mma_copy16(at, x->p + x->at + (IDX)(j0 + jj) * x->row + (IDX)d);
        else
            *(__local uint4 *)at = mma_chunk_by_value(x, j0 + jj, d, hi);
    }
}

/* Keys j0 .. j0 + MMA_KT - 1 of K and V copied into kt and vt, committed as one group. */
MMA_INLINE void mma_copy_tile(const mma_matrix *k, const mma_matrix *v, int j0, int hi,
                              __local uint *kt, __local uint *vt) {
    mma_copy_rows(k, HEAD_DIM, MMA_KS, j0, hi, kt);
    mma_copy_rows(v, VALUE_DIM, MMA_VS, j0, hi, vt);
    mma_copy_commit();
}

/* Once the work-item's copies into vt landed: its chunks' NaN and Inf values as 0, `garbage`
 * set when there was one (mma_stage's rule, applied in place). */
MMA_INLINE void mma_clean_tile(__local uint *vt, __local int *garbage) {
    const int lid = (int)get_local_id(0);
    int bad = 0;
    mma_copy_wait();
    UNROLL for (int i = 0; i < MMA_VREGS; ++i) {
        const int e = lid + i * MMA_THREADS, jj = MMA_CHUNK_ROW(e, VALUE_DIM);
        if (e >= MMA_VCHUNKS) continue;
        __local uint4 *chunk =
            (__local uint4 *)(vt + jj * MMA_VS + MMA_CHUNK_AT(e, VALUE_DIM) / MMA_PER_WORD);
        const uint4 x = *chunk;
        if (mma_any_not_finite(x))
            *chunk = (uint4)(mma_finite_word(x.s0, &bad), mma_finite_word(x.s1, &bad),
                             mma_finite_word(x.s2, &bad), mma_finite_word(x.s3, &bad));
    }
    if (bad) atomic_or(garbage, 1);
}

__kernel __attribute__((reqd_work_group_size(MMA_WARPS * MMA_WARP, 1, 1))) void
attention_mma(TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(K_T, k), TENSOR_PARAMS(V_T, v),
              __global CAT(storage_, O_T) * o, IDX o_off, IDX o_s0, IDX o_s1, IDX o_s2, IDX o_s3,
              int B, int Hq, int Hkv, int Sq, int Sk, int order LSE_PARAMS PART_PARAMS,
              MASK_PARAMS) {
    __local float scratch[MMA_WARPS * MMA_SCRATCH_FLOATS];
    __local float xs[MMA_WARPS * MMA_EXCHANGE_FLOATS];
    /* a key tile and its values (two of each with MMA_ASYNC), row-major, two values a word (uint4:
     * the aligned loads store 16 bytes, the fragment loads read 16-byte rows); V's NaN and Inf
     * as 0 */
    __local uint4 kt4[MMA_BUFFERS * MMA_KT * MMA_KS / 4], vt4[MMA_BUFFERS * MMA_KT * MMA_VS / 4];
    __local uint4 qt4[MMA_BQ * MMA_KS / 4]; /* the group's q rows, as K's */
    __local uchar seen[MMA_WARPS * MMA_WQ * MMA_KT]; /* weight != 0, for the non-finite values */
    __local int span[2];
    __local int garbage[3]; /* a tile's flag, by the tile's number mod 2 (mod 3 with MMA_ASYNC,
                               which sets the next tile's while this one's is read) */
    __local uint *kt = (__local uint *)kt4, *vt = (__local uint *)vt4, *qt = (__local uint *)qt4;
    const int lid = (int)get_local_id(0), warp = lid / MMA_WARP;
    const int blocks = (Sq + MMA_BQ - 1) / MMA_BQ;
    /* with SPLIT, `splits` groups take a block's queries, each its chunk of the keys */
    const int split = (int)get_group_id(0) % SPLITS;
    const int2 at = unit_place((int)get_group_id(0) / SPLITS, blocks, B * Hq, order);
    const int bh = at.x, h = bh % Hq, b = bh / Hq, hk = h / (Hq / Hkv);
    const mma_matrix qm = MMA_MATRIX(q, b, h), km = MMA_MATRIX(k, b, hk), vm = MMA_MATRIX(v, b, hk);
#if SPLIT
    const int2 split_keys = (int2)(split * chunk, split * chunk + chunk);
#else
    const int2 split_keys = (int2)(0, Sk);
#endif
    MASK_PACK(p);
    int rows[MMA_ROWS];
    int lo = Sk, hi = 0;
    int2 plain = (int2)(0, Sk); /* the keys that each of the lane's rows sees plainly */
    UNROLL for (int a = 0; a < MMA_ROWS; ++a) {
        rows[a] = at.y * MMA_BQ + warp * MMA_WQ + mma_lane_row(a);
        mask_row r = mma_row_mask(&p, b, h, rows[a], Sq, Sk);
#if SPLIT
        mask_row_clip(&r, split_keys.x, split_keys.y);
#endif
        if (r.lo < r.hi) lo = min(lo, r.lo), hi = max(hi, r.hi);
        const int2 mine = mask_plain_keys(&r);
        if (rows[a] < Sq) plain = (int2)(max(plain.x, mine.x), min(plain.y, mine.y));
    }
    if (lid == 0) garbage[0] = garbage[1] = 0;
    const int2 keys = group_key_span(span, lo, hi, Sk); /* its barriers publish the flags */

    mma_stage_q(&qm, at.y * MMA_BQ, Sq, qt); /* the first tile's barrier publishes it */
    float acc[MMA_MT][MMA_VB][4], m[MMA_ROWS], l[MMA_ROWS];
    UNROLL for (int a = 0; a < MMA_ROWS; ++a) m[a] = -INFINITY, l[a] = 0.0f;
    UNROLL for (int mt = 0; mt < MMA_MT; ++mt)
        UNROLL for (int n = 0; n < MMA_VB; ++n)
            UNROLL for (int f = 0; f < 4; ++f) acc[mt][n][f] = 0.0f;

    __local uchar *warp_seen = seen + warp * MMA_WQ * MMA_KT;
    /* tiles start at multiples of MMA_KT, so that they are the same whatever the group's
     * size (UNIT_QUERIES): the keys before the span are hidden from every row */
    const int first = keys.x / MMA_KT * MMA_KT;
#if MMA_ASYNC
    if (keys.x < keys.y) {
        mma_copy_tile(&km, &vm, first, keys.y, kt, vt);
        mma_clean_tile(vt, &garbage[0]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int j0 = first, tile = 0; j0 < keys.y; j0 += MMA_KT, ++tile) {
        /* this tile's flag was set before the last barrier; the one two tiles ahead is reset now
         * (everyone read it, a tile ago) and set after the next barrier */
        const bool flagged = garbage[tile % 3] != 0, more = j0 + MMA_KT < keys.y;
        if (lid == 0) garbage[(tile + 2) % 3] = 0;
        __local uint *kt_next = kt + ((tile + 1) & 1) * MMA_KT * MMA_KS;
        __local uint *vt_next = vt + ((tile + 1) & 1) * MMA_KT * MMA_VS;
        if (more) mma_copy_tile(&km, &vm, j0 + MMA_KT, keys.y, kt_next, vt_next);
        const __local uint *kt_now = kt + (tile & 1) * MMA_KT * MMA_KS;
        const __local uint *vt_now = vt + (tile & 1) * MMA_KT * MMA_VS;
#else
    uint4 kr[MMA_KREGS], vr[MMA_VREGS];
    if (MMA_AHEAD && keys.x < keys.y) mma_fetch(&km, &vm, first, keys.y, kr, vr);
    for (int j0 = first, tile = 0; j0 < keys.y; j0 += MMA_KT, tile ^= 1) {
        const bool flagged = mma_next_tile(&km, &vm, j0, keys.y, tile, kr, vr, kt, vt, garbage);
        const __local uint *kt_now = kt, *vt_now = vt;
#endif

        float s[MMA_MT][MMA_KB][4]; /* the scores, then the weights */
        mma_scores(qt + warp * MMA_WQ * MMA_KS, kt_now, s, scratch);
        mma_mask(&p, b, h, rows, Sq, Sk, split_keys, j0, j0 >= plain.x && j0 + MMA_KT <= plain.y,
                 s);
        mma_softmax(s, m, l, acc, flagged, warp_seen, xs);
        mma_values(s, vt_now, acc, scratch);
        if (flagged) {
            barrier(CLK_LOCAL_MEM_FENCE); /* seen complete */
            mma_add_non_finite(&vm, j0, keys.y, warp_seen, acc);
        }
#if MMA_ASYNC
        if (more) mma_clean_tile(vt_next, &garbage[(tile + 1) % 3]);
        barrier(CLK_LOCAL_MEM_FENCE); /* the next tile landed; everyone is done with this one */
#endif
    }

    UNROLL for (int mt = 0; mt < MMA_MT; ++mt) mma_quad_reduce(l + 2 * mt, 0, xs);
    const int t = lid % 4;
    UNROLL for (int a = 0; a < MMA_ROWS; ++a) {
        const int i = rows[a];
        if (i >= Sq) continue;
#if SPLIT
        /* the split's share for attention_merge: its max (NaN for a NaN row), sum and outputs */
        __global float *at = part + ((IDX)(bh * Sq + i) * SPLITS + split) * (VALUE_DIM + 2);
        if (t == 0) at[0] = isnan(l[a]) ? NAN : m[a], at[1] = l[a];
        UNROLL for (int n = 0; n < MMA_VB; ++n)
            UNROLL for (int e = 0; e < 2; ++e)
                at[2 + n * 8 + 2 * t + e] = acc[a / 2][n][(a % 2) * 2 + e];
#else
        /* a NaN row's sum is NaN, which makes its outputs and lse NaN below */
        const bool empty = m[a] == -INFINITY && !isnan(l[a]);
        const float inv = 1.0f / l[a];
        UNROLL for (int n = 0; n < MMA_VB; ++n)
            UNROLL for (int e = 0; e < 2; ++e) {
                const float x = acc[a / 2][n][(a % 2) * 2 + e];
                const float value = empty ? EMPTY_VALUE : x * inv;
                CAT(store_, O_T)(o, AT(o, b, h, i, n * 8 + 2 * t + e), value);
            }
        if (t == 0) STORE_LSE(i, empty ? -INFINITY : m[a] + log(l[a]));
#endif
    }
}
#endif /* BUILDS(5) && MMA_T */

#if BUILDS(6) && defined(MMA_T) && !MMA_T_IS_F32
/* attention_units: attention_mma's work on cl/mma.cl's subgroup tile (16 x 16 x 16 products), so
 * that it runs on every mechanism the tile has (MMA_UNIT: AMD's WMMA and MFMA, Intel's dpas,
 * NVIDIA's mma.sync), whose register layouts differ: nothing here depends on one, since every
 * exchange between the products and the softmax goes through local memory at the places
 * mma_c_at gives. A group of MMA_WARPS subgroups takes 16 queries a subgroup (MMA_WQ = 16) of
 * one (batch, query head). Per tile of MMA_KT keys, staged as attention_mma stages them: S = q k^T
 * as MMA_KT / 16 tiles per subgroup (q's rows as A, K's rows as B stored n-major); the raw scores
 * to local memory; each score row's mask and online softmax by its owners, UNITS_PARTS lanes of
 * the subgroup that each take every UNITS_PARTS-th key of it (a row's max combined through local
 * memory, its sum kept per lane until the end), which write the weights, rounded to MMA_T, and
 * the row's rescale to local memory; the accumulators rescaled at their places; P V as tiles of
 * the weights (A) and V's rows (B stored k-major). The promises are attention_mma's, kept the
 * same way (the mask's scale alone in tiles a row sees whole, exp2 weights, NaN and Inf values
 * added apart from the products where their weight is not 0, NaN rows found by their sums).
 * Needs HEAD_DIM and VALUE_DIM multiples of 16 (the host checks), and no key split. */
#if MMA_WQ != 16
#error "attention_units takes 16 queries a subgroup"
#endif
#define UNITS_NT    (MMA_KT / 16)                    /* 16-key tiles of S */
#define UNITS_QC    (HEAD_DIM / 16)                  /* 16-dim tiles of q (A) and K (B) */
#define UNITS_VT    (VALUE_DIM / 16)                 /* 16-column tiles of the output */
#define UNITS_PARTS (MMA_SG > 16 ? MMA_SG / 16 : 1)  /* lanes that share a score row */
#define UNITS_ROWS  (MMA_SG < 16 ? 16 / MMA_SG : 1)  /* score rows a lane shares in */
#define UNITS_SS    (MMA_KT + 1)                     /* floats a score row takes */
#define UNITS_PS    (MMA_KT + 8)                     /* 16-bit weights a row: 16-byte aligned */

/* The subgroup's score row (0 .. 15) that is the lane's row a, and which part of it the lane
 * takes: keys part, part + UNITS_PARTS, ... of each tile. */
inline int units_row(int a) {
    return (int)get_local_id(0) % MMA_SG % 16 + a * MMA_SG;
}
inline int units_part(void) {
    return (int)get_local_id(0) % MMA_SG / 16;
}

/* S = q k^T over the staged tile: s[nt] is the 16 x 16 tile of keys 16 nt .. 16 nt + 15, at the
 * lane's places (mma_c_at). q16: the subgroup's 16 q rows. */
MMA_INLINE void units_scores(const __local ushort *q16, const __local ushort *k16,
                             float s[UNITS_NT][MMA_CV], __local float *scratch) {
    UNROLL for (int nt = 0; nt < UNITS_NT; ++nt)
        UNROLL for (int i = 0; i < MMA_CV; ++i) s[nt][i] = 0.0f;
    MMA_NATIVE_UNROLL for (int c = 0; c < UNITS_QC; ++c) {
        uint a[MMA_AW];
        mma_tile_load_a(a, q16 + c * 16, 2 * MMA_KS);
        MMA_NATIVE_UNROLL for (int nt = 0; nt < UNITS_NT; ++nt) {
            uint b[MMA_BW];
            mma_tile_load_b(b, k16 + nt * 16 * (2 * MMA_KS) + c * 16, 2 * MMA_KS, 0);
            mma_tile(s[nt], a, b, scratch);
        }
    }
}

/* The mask and the online-softmax step over the subgroup's scores ss (raw, UNITS_SS floats a
 * row), by the rows' owners: each row's max m and the lane's part of its sum l updated; the
 * weights, rounded to MMA_T, into pt (UNITS_PS a row), each row's rescale factor into rescale;
 * where the tile holds NaN or Inf values (`flagged`), seen[row * MMA_KT + key] records which
 * weights are not 0. `tops` holds 16 x UNITS_PARTS floats: the parts' maxima. The subgroup's
 * rows are the query rows first .. first + 15; plain[a], the keys the lane's row a sees plainly
 * (mask_plain_keys, kept from the start): in a tile inside them the scale alone, elsewhere the
 * row's mask, made again here (kept, it would hold registers through every tile). */
MMA_INLINE void units_softmax(const mask_params *p, int b, int h, int first, int Sq, int Sk, int j0,
                              const int2 plain[UNITS_ROWS], __local float *ss,
                              __local float *tops, float m[UNITS_ROWS], float l[UNITS_ROWS],
                              __local ushort *pt, __local float *rescale, bool flagged,
                              __local uchar *seen) {
    const int part = units_part();
    UNROLL for (int a = 0; a < UNITS_ROWS; ++a) {
        const int row = units_row(a);
        __local float *x = ss + row * UNITS_SS;
        float top = -INFINITY;
        if (j0 >= plain[a].x && j0 + MMA_KT <= plain[a].y) {
            for (int c = part; c < MMA_KT; c += UNITS_PARTS) {
                x[c] *= p->scale;
                top = fmax(top, x[c]);
            }
        } else {
            const mask_row r = mma_row_mask(p, b, h, first + row, Sq, Sk);
            for (int c = part; c < MMA_KT; c += UNITS_PARTS) {
                const int j = j0 + c;
                x[c] = j >= r.lo && j < r.hi ? mask_score(p, &r, j, x[c]) : -INFINITY;
                top = fmax(top, x[c]);
            }
        }
        tops[row * UNITS_PARTS + part] = top;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    UNROLL for (int a = 0; a < UNITS_ROWS; ++a) {
        const int row = units_row(a);
        float top = tops[row * UNITS_PARTS];
        for (int q = 1; q < UNITS_PARTS; ++q) top = fmax(top, tops[row * UNITS_PARTS + q]);
        /* as attention_mma's: an unchanged max keeps the row exactly, an empty row keeps base 0 */
        const float m_new = fmax(m[a], top);
        const float base = m_new == -INFINITY ? 0.0f : m_new;
        const float kept = m[a] == m_new ? 1.0f : exp2((m[a] - m_new) * M_LOG2E_F);
        m[a] = m_new;
        l[a] *= kept;
        if (part == 0) rescale[row] = kept;
        for (int c = part; c < MMA_KT; c += UNITS_PARTS) {
            const float w = exp2((ss[row * UNITS_SS + c] - base) * M_LOG2E_F);
            l[a] += w;
            pt[row * UNITS_PS + c] = (ushort)mma_bits(w);
            if (flagged) seen[row * MMA_KT + c] = w != 0.0f;
        }
    }
}

/* acc += P V over the staged tile: the subgroup's weights (pt) as A, V's rows as B (k-major). */
MMA_INLINE void units_values(const __local ushort *pt, const __local ushort *v16,
                             float acc[UNITS_VT][MMA_CV], __local float *scratch) {
    MMA_NATIVE_UNROLL for (int c = 0; c < UNITS_NT; ++c) {
        uint a[MMA_AW];
        mma_tile_load_a(a, pt + c * 16, UNITS_PS);
        MMA_NATIVE_UNROLL for (int n = 0; n < UNITS_VT; ++n) {
            uint b[MMA_BW];
            mma_tile_load_b(b, v16 + c * 16 * (2 * MMA_VS) + n * 16, 2 * MMA_VS, 1);
            mma_tile(acc[n], a, b, scratch);
        }
    }
}

/* The NaN and Inf values of keys j0 .. (below hi) went into the products as 0: each lane adds
 * those that its places of the output weigh (seen: the subgroup's rows), read again from V. */
MMA_INLINE void units_add_non_finite(const mma_matrix *v, int j0, int hi,
                                     const __local uchar *seen, float acc[UNITS_VT][MMA_CV]) {
    const int lane = (int)get_local_id(0) % MMA_SG;
    for (int jj = 0; jj < MMA_KT && j0 + jj < hi; ++jj) {
        const IDX at = v->at + (IDX)(j0 + jj) * v->row;
        UNROLL for (int i = 0; i < MMA_CV; ++i) {
            const int place = mma_c_at(lane, i);
            if (!seen[place / 16 * MMA_KT + jj]) continue;
            UNROLL for (int n = 0; n < UNITS_VT; ++n) {
                const uint bits = v->p[at + (IDX)(n * 16 + place % 16) * v->step];
                if (mma_not_finite(bits)) acc[n][i] += mma_half_value(bits, 0);
            }
        }
    }
}

__kernel __attribute__((reqd_work_group_size(MMA_THREADS, 1, 1))) MMA_SUBGROUP_ATTRIBUTE void
attention_units(TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(K_T, k), TENSOR_PARAMS(V_T, v),
                __global CAT(storage_, O_T) * o, IDX o_off, IDX o_s0, IDX o_s1, IDX o_s2,
                IDX o_s3, int B, int Hq, int Hkv, int Sq, int Sk, int order LSE_PARAMS,
                MASK_PARAMS) {
    __local float scratch[MMA_WARPS * MMA_TILE_SCRATCH];
    /* the key tile and its values, row-major (V's NaN and Inf as 0); the group's q rows */
    __local uint4 kt4[MMA_KT * MMA_KS / 4], vt4[MMA_KT * MMA_VS / 4], qt4[MMA_BQ * MMA_KS / 4];
    /* a subgroup's: raw then masked scores, the parts' maxima, its weights (rows 16-byte
     * aligned), each row's rescale (at the end: its sum and max), the weights' flags */
    __local float ss_all[MMA_WARPS * 16 * UNITS_SS], tops_all[MMA_WARPS * 16 * UNITS_PARTS];
    __local uint4 pt4[MMA_WARPS * 16 * UNITS_PS / 8];
    __local float rows_all[MMA_WARPS * 2 * 16];
    __local uchar seen_all[MMA_WARPS * 16 * MMA_KT];
    __local int span[2], garbage[2];
    __local uint *kt = (__local uint *)kt4, *vt = (__local uint *)vt4, *qt = (__local uint *)qt4;
    const int lid = (int)get_local_id(0), sg = lid / MMA_SG, lane = lid % MMA_SG;
    const int part = units_part();
    __local float *ss = ss_all + sg * 16 * UNITS_SS, *tops = tops_all + sg * 16 * UNITS_PARTS;
    __local float *rescale = rows_all + sg * 2 * 16;
    __local ushort *pt = (__local ushort *)pt4 + sg * 16 * UNITS_PS;
    __local uchar *seen = seen_all + sg * 16 * MMA_KT;
    const int blocks = (Sq + MMA_BQ - 1) / MMA_BQ;
    const int2 at = unit_place((int)get_group_id(0), blocks, B * Hq, order);
    const int bh = at.x, h = bh % Hq, b = bh / Hq, hk = h / (Hq / Hkv);
    const int first = at.y * MMA_BQ + sg * 16; /* the subgroup's first row */
    const mma_matrix qm = MMA_MATRIX(q, b, h), km = MMA_MATRIX(k, b, hk), vm = MMA_MATRIX(v, b, hk);
    MASK_PACK(p);
    int lo = Sk, hi = 0;
    int2 plain[UNITS_ROWS];
    UNROLL for (int a = 0; a < UNITS_ROWS; ++a) {
        const mask_row r = mma_row_mask(&p, b, h, first + units_row(a), Sq, Sk);
        if (r.lo < r.hi) lo = min(lo, r.lo), hi = max(hi, r.hi);
        plain[a] = mask_plain_keys(&r);
    }
    if (lid == 0) garbage[0] = 0;
    const int2 keys = group_key_span(span, lo, hi, Sk); /* its barriers publish garbage[0] */

    mma_stage_q(&qm, at.y * MMA_BQ, Sq, qt); /* the first tile's barrier publishes it */
    float acc[UNITS_VT][MMA_CV], m[UNITS_ROWS], l[UNITS_ROWS];
    UNROLL for (int a = 0; a < UNITS_ROWS; ++a) m[a] = -INFINITY, l[a] = 0.0f;
    UNROLL for (int n = 0; n < UNITS_VT; ++n)
        UNROLL for (int i = 0; i < MMA_CV; ++i) acc[n][i] = 0.0f;

    uint4 kr[MMA_KREGS], vr[MMA_VREGS];
    const int j_first = keys.x / MMA_KT * MMA_KT; /* tiles at multiples of MMA_KT, as mma's */
    if (MMA_AHEAD && keys.x < keys.y) mma_fetch(&km, &vm, j_first, keys.y, kr, vr);
    for (int j0 = j_first, tile = 0; j0 < keys.y; j0 += MMA_KT, tile ^= 1) {
        const bool flagged = mma_next_tile(&km, &vm, j0, keys.y, tile, kr, vr, kt, vt, garbage);
        float s[UNITS_NT][MMA_CV];
        units_scores((const __local ushort *)(qt + sg * 16 * MMA_KS), (const __local ushort *)kt,
                     s, scratch);
        UNROLL for (int nt = 0; nt < UNITS_NT; ++nt)
            UNROLL for (int i = 0; i < MMA_CV; ++i) {
                const int place = mma_c_at(lane, i);
                ss[place / 16 * UNITS_SS + nt * 16 + place % 16] = s[nt][i];
            }
        barrier(CLK_LOCAL_MEM_FENCE);
        units_softmax(&p, b, h, first, Sq, Sk, j0, plain, ss, tops, m, l, pt, rescale, flagged,
                      seen);
        barrier(CLK_LOCAL_MEM_FENCE); /* the weights, their flags and the rescales */
        UNROLL for (int n = 0; n < UNITS_VT; ++n)
            UNROLL for (int i = 0; i < MMA_CV; ++i) acc[n][i] *= rescale[mma_c_at(lane, i) / 16];
        units_values(pt, (const __local ushort *)vt, acc, scratch);
        if (flagged) units_add_non_finite(&vm, j0, keys.y, seen, acc);
    }

    /* each row's sum (its parts' in order) and max, for every lane that holds its outputs */
    barrier(CLK_LOCAL_MEM_FENCE); /* the last tile's tops and rescales are read */
    UNROLL for (int a = 0; a < UNITS_ROWS; ++a) tops[units_row(a) * UNITS_PARTS + part] = l[a];
    barrier(CLK_LOCAL_MEM_FENCE);
    __local float *sums = rows_all + sg * 2 * 16, *maxima = sums + 16;
    UNROLL for (int a = 0; a < UNITS_ROWS; ++a) {
        const int row = units_row(a), i = first + row;
        if (part != 0) continue;
        float sum = tops[row * UNITS_PARTS];
        for (int q = 1; q < UNITS_PARTS; ++q) sum += tops[row * UNITS_PARTS + q];
        sums[row] = sum, maxima[row] = m[a];
        /* a NaN row's sum is NaN, which makes its outputs and lse NaN */
        const bool empty = m[a] == -INFINITY && !isnan(sum);
        if (i < Sq) STORE_LSE(i, empty ? -INFINITY : m[a] + log(sum));
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    UNROLL for (int i = 0; i < MMA_CV; ++i) {
        const int place = mma_c_at(lane, i), row = place / 16, qi = first + row;
        if (qi >= Sq) continue;
        const bool empty = maxima[row] == -INFINITY && !isnan(sums[row]);
        const float inv = 1.0f / sums[row];
        UNROLL for (int n = 0; n < UNITS_VT; ++n) {
            const float value = empty ? EMPTY_VALUE : acc[n][i] * inv;
            CAT(store_, O_T)(o, AT(o, b, h, qi, n * 16 + place % 16), value);
        }
    }
}
#endif /* BUILDS(6) && MMA_T */

#if BUILDS(4)
#ifndef MQ
#define MQ 4
#endif
#ifndef MK
#define MK 2
#endif
#ifndef ROWS
#define ROWS 16
#endif
#define COLS (TK / MK)                             /* work-items along the keys of a tile */
#define MD   ((VALUE_DIM + COLS - 1) / COLS)        /* value dims per work-item */
#define BQ   (ROWS * MQ)                            /* queries a block, at most */

/* The running max of each of the work-item's rows over the tile's scores s (-INFINITY where
 * hidden), combined across the row's COLS work-items through red: the same value in each. */
inline void micro_row_max(__local float (*red)[BQ], const float s[MQ][MK], float m_new[MQ],
                          const float m[MQ], int tx, int ty, int rows) {
    for (int a = 0; a < MQ; ++a) {
        float mx = -INFINITY;
        for (int c = 0; c < MK; ++c) mx = fmax(mx, s[a][c]);
        red[tx][ty + a * rows] = mx;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int a = 0; a < MQ; ++a) {
        float mx = m[a];
        for (int t = 0; t < COLS; ++t) mx = fmax(mx, red[t][ty + a * rows]);
        m_new[a] = mx;
    }
}

__kernel void attention_micro(TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(K_T, k), TENSOR_PARAMS(V_T, v),
                              __global CAT(storage_, O_T) * o, IDX o_off, IDX o_s0, IDX o_s1,
                              IDX o_s2, IDX o_s3, int B, int Hq, int Hkv, int Sq,
                              int Sk, int order LSE_PARAMS PART_PARAMS, MASK_PARAMS) {
    __local float qs[HEAD_DIM][BQ]; /* the block's queries, d-major */
    __local float ks[HEAD_DIM][TK]; /* a key tile, d-major */
    __local float vs[TK][VALUE_DIM];
    __local float ps[TK][BQ];   /* the tile's weights, key-major */
    __local float red[COLS][BQ]; /* a row's partials, one per work-item of the row */
    __local int span[2];
    __local int garbage; /* the V tile holds a NaN or Inf */
    const int tid = (int)get_local_id(0), tx = tid % COLS, ty = tid / COLS;
    const int threads = (int)get_local_size(0), rows = threads / COLS, bq = rows * MQ;
    const int blocks = (Sq + bq - 1) / bq;
    const int group = (int)get_group_id(0), split = group % SPLITS;
    const int2 at = unit_place(group / SPLITS, blocks, B * Hq, order);
    const int bh = at.x, h = bh % Hq, b = bh / Hq, hk = h / (Hq / Hkv);
    const int i0 = at.y * bq;
    MASK_PACK(p);
    mask_row r[MQ];
    int lo = Sk, hi = 0;
    for (int a = 0; a < MQ; ++a) {
        const int i = i0 + ty + a * rows;
        r[a] = mask_row_start(&p, b, h, min(i, Sq - 1), Sq, Sk);
        CLIP_TO_SPLIT(r[a], split);
        if (i >= Sq) r[a].hi = r[a].lo; /* a row past Sq only helps load tiles */
        if (r[a].lo < r[a].hi) lo = min(lo, r[a].lo), hi = max(hi, r[a].hi);
    }
    if (tid == 0) garbage = 0;
    for (int e = tid; e < bq * HEAD_DIM; e += threads) {
        const int row = e / HEAD_DIM, d = e % HEAD_DIM, i = i0 + row;
        qs[d][row] = i < Sq ? CAT(load_, Q_T)(q, AT(q, b, h, i, d)) : 0.0f;
    }
    const int2 keys = group_key_span(span, lo, hi, Sk); /* its barriers publish qs, garbage */

    /* a NaN score needs no flag here: its weight exp(NaN) makes the row's sum NaN */
    float acc[MQ][MD], m[MQ], l[MQ];
    for (int a = 0; a < MQ; ++a) {
        m[a] = -INFINITY, l[a] = 0.0f;
        for (int c = 0; c < MD; ++c) acc[a][c] = 0.0f;
    }
    for (int j0 = keys.x; j0 < keys.y; j0 += TK) {
        barrier(CLK_LOCAL_MEM_FENCE); /* everyone is done with the last tile */
        for (int e = tid; e < TK * HEAD_DIM; e += threads) {
            const int jj = e / HEAD_DIM, d = e % HEAD_DIM, j = j0 + jj;
            ks[d][jj] = j < keys.y ? CAT(load_, K_T)(k, AT(k, b, hk, j, d)) : 0.0f;
        }
        for (int e = tid; e < TK * VALUE_DIM; e += threads) {
            const int jj = e / VALUE_DIM, d = e % VALUE_DIM, j = j0 + jj;
            const float x = j < keys.y ? CAT(load_, V_T)(v, AT(v, b, hk, j, d)) : 0.0f;
            vs[jj][d] = x;
            if (!isfinite(x)) atomic_or(&garbage, 1);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        const int tile_garbage = garbage;

        float s[MQ][MK];
        for (int a = 0; a < MQ; ++a)
            for (int c = 0; c < MK; ++c) s[a][c] = 0.0f;
        /* unrolled where the FMAs are (Oclgrind ran the kernel twice as fast); unrolling the
         * per-row bookkeeping too made Intel's pvc build spill (33 at D = 64, 95 at 128) */
        for (int d = 0; d < HEAD_DIM; ++d) {
            float qa[MQ], kc[MK];
            UNROLL for (int a = 0; a < MQ; ++a) qa[a] = qs[d][ty + a * rows];
            UNROLL for (int c = 0; c < MK; ++c) kc[c] = ks[d][tx + c * COLS];
            UNROLL for (int a = 0; a < MQ; ++a)
                UNROLL for (int c = 0; c < MK; ++c) s[a][c] = fma(qa[a], kc[c], s[a][c]);
        }
        for (int a = 0; a < MQ; ++a)
            for (int c = 0; c < MK; ++c) {
                const int j = j0 + tx + c * COLS;
                s[a][c] = j >= r[a].lo && j < r[a].hi ? mask_score(&p, &r[a], j, s[a][c])
                                                      : -INFINITY;
            }
        float m_new[MQ];
        micro_row_max(red, s, m_new, m, tx, ty, rows);
        for (int a = 0; a < MQ; ++a) {
            const float keep = m_new[a] == -INFINITY ? 0.0f : exp(m[a] - m_new[a]);
            l[a] *= keep;
            for (int c = 0; c < MD; ++c) acc[a][c] *= keep;
            for (int c = 0; c < MK; ++c) {
                const float w = s[a][c] == -INFINITY ? 0.0f : exp(s[a][c] - m_new[a]);
                l[a] += w;
                ps[tx + c * COLS][ty + a * rows] = w;
            }
            m[a] = m_new[a];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (tid == 0) garbage = 0; /* read by all before the last barrier; set after the next */

        /* a zero weight skips its V row where the tile holds garbage: what a hidden row holds
         * (NaN, Inf) never counts; elsewhere every product is a plain FMA */
        for (int jj = 0; jj < TK; ++jj) {
            float pa[MQ], vc[MD];
            UNROLL for (int a = 0; a < MQ; ++a) pa[a] = ps[jj][ty + a * rows];
            UNROLL for (int c = 0; c < MD; ++c) {
                const int e = tx + c * COLS;
                vc[c] = e < VALUE_DIM ? vs[jj][e] : 0.0f;
            }
            if (tile_garbage) {
                UNROLL for (int a = 0; a < MQ; ++a)
                    UNROLL for (int c = 0; c < MD; ++c)
                        acc[a][c] = pa[a] != 0.0f ? fma(pa[a], vc[c], acc[a][c]) : acc[a][c];
            } else {
                UNROLL for (int a = 0; a < MQ; ++a)
                    UNROLL for (int c = 0; c < MD; ++c) acc[a][c] = fma(pa[a], vc[c], acc[a][c]);
            }
        }
    }

    /* each row's sum over its work-items, in a fixed order */
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int a = 0; a < MQ; ++a) red[tx][ty + a * rows] = l[a];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int a = 0; a < MQ; ++a) {
        const int i = i0 + ty + a * rows;
        float total = 0.0f;
        for (int t = 0; t < COLS; ++t) total += red[t][ty + a * rows];
        if (i >= Sq) continue;
        const bool nan_row = isnan(total);
#if SPLIT
        __global float *at = part + ((IDX)(bh * Sq + i) * SPLITS + split) * (VALUE_DIM + 2);
        if (tx == 0) at[0] = nan_row ? NAN : m[a], at[1] = total;
        for (int c = 0; c < MD; ++c)
            if (tx + c * COLS < VALUE_DIM) at[2 + tx + c * COLS] = acc[a][c];
#else
        const bool empty = m[a] == -INFINITY && !nan_row;
        const float inv = nan_row ? NAN : 1.0f / total;
        for (int c = 0; c < MD; ++c) {
            const int e = tx + c * COLS;
            if (e < VALUE_DIM)
                CAT(store_, O_T)(o, AT(o, b, h, i, e),
                                 empty ? EMPTY_VALUE : acc[a][c] * inv);
        }
        if (tx == 0) STORE_LSE(i, empty ? -INFINITY : nan_row ? NAN : m[a] + log(total));
#endif
    }
}
#endif /* BUILDS(4) */

#if SPLIT
/* out[b, h, i, e] (and lse once per row) from the `splits` partial results of row (b, h, i): each
 * split's share is rescaled by exp(m_s - max m). A work-item per output element. */
__kernel void attention_merge(__global const float *part, __global CAT(storage_, O_T) * o,
                              IDX o_off, IDX o_s0, IDX o_s1, IDX o_s2, IDX o_s3, int B, int Hq,
                              int Sq, int splits LSE_PARAMS) {
    const size_t item = get_global_id(0);
    if (item >= (size_t)B * Hq * Sq * VALUE_DIM) return;
    const int e = (int)(item % VALUE_DIM), row = (int)(item / VALUE_DIM);
    const int i = row % Sq, bh = row / Sq, h = bh % Hq, b = bh / Hq;
    __global const float *at = part + (IDX)row * SPLITS * (VALUE_DIM + 2);
    float m = -INFINITY;
    int nan_seen = 0;
    for (int s = 0; s < SPLITS; ++s) {
        const float ms = at[s * (VALUE_DIM + 2)];
        nan_seen |= isnan(ms);
        m = fmax(m, ms);
    }
    float l = 0.0f, acc = 0.0f;
    for (int s = 0; s < SPLITS && m != -INFINITY; ++s) {
        __global const float *split = at + s * (VALUE_DIM + 2);
        if (split[0] == -INFINITY) continue;
        const float w = exp(split[0] - m);
        l = fma(w, split[1], l);
        acc = fma(w, split[2 + e], acc);
    }
    const bool empty = m == -INFINITY && !nan_seen;
    const float value = empty ? EMPTY_VALUE : nan_seen ? NAN : acc / l;
    CAT(store_, O_T)(o, AT(o, b, h, i, e), value);
    if (e == 0) STORE_LSE(i, empty ? -INFINITY : nan_seen ? NAN : m + log(l));
}
#endif
