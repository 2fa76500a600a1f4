/*
 * The gradients of fused attention (cl/attention.cl), never storing the Sq x Sk scores. Given
 * dO (the loss's gradient in out), the forward's out and its log-sum-exp, with
 * P_ij = exp(s_ij - lse_i) over the visible keys (cl/mask.cl's s, from x_ij = q_i . k_j):
 *
 *   dV_j = sum_i P_ij dO_i      dP_ij = dO_i . V_j      dS_ij = P_ij (dP_ij - D_i)
 *   D_i  = dO_i . O_i           dQ_i = sum_j c_ij dS_ij K_j      dK_j = sum_i c_ij dS_ij Q_i
 *   dbias_ij = dS_ij (summed over the bias's broadcast dims)
 *
 * c_ij = ds/dx = scale, times 1 - tanh^2(scale x_ij / softcap) under a softcap. Query head h
 * reads kv head h / (Hq / Hkv); a kv head's gradients sum over its query heads.
 *
 *   backward_rows     a work-item per query row: D_i and the row's lse into `stats`. A row whose
 *                     lse is not finite (no visible key: -inf; a NaN score: NaN) is dead: it
 *                     adds nothing to any gradient and gets dq 0, and its q, dO and out are
 *                     never read.
 *   backward_pack     K and V in tiles of VEC keys, d-major (tile[d][lane], as attention.cl's
 *                     pack), 0 past the batch's key length.
 *   backward_keys     a work-item per tile of VEC keys of one (batch, kv head) and row split,
 *                     the keys along the vector lanes: dK and dV are HEAD_DIM + VALUE_DIM
 *                     vectors of VEC keys. It walks the query heads of its group and their
 *                     queries BM at a time (its split's run of them); each score, dP, dV and dK
 *                     update is a full-width vector FMA that broadcasts one element of q or
 *                     dO, and no sum is horizontal. No atomics: every gradient element has one
 *                     writer and a fixed summation order.
 *   backward_keys_merge  (ROW_SPLIT) a work-item per element of dK and dV: the sum of
 *                     the row splits' partials, in split order.
 *   backward_queries  a work-item per BM queries of one (batch, query head): a tile's scores
 *                     and dP as vectors of VEC keys (as above), then dQ += dS K along the head
 *                     dim, K row by row.
 *   backward_merge    (SPLIT) a work-item per element of dQ: the sum of the key splits'
 *                     partials, in split order.
 *
 * With TILED (GPUs: many work-items, little private memory) backward_keys_tiles and
 * backward_queries_tiles replace pack, keys and queries (Tiles, below).
 * dbias (HAS_DBIAS) is added up by the keys passes, which hold every visible pair's dS (Bias,
 * below), with backward_bias_clear and backward_bias_merge around them.
 *
 * Invisible positions never reach a gradient: a masked score gives P = 0 and dS is selected 0
 * where P is not positive, the packed K and V are 0 past the key lengths, and dQ skips the K
 * rows of zero weights in a tile some row cannot see all of.
 *
 * Build options: Q_T, K_T, V_T, O_T (out), DO_T (dout), DQ_T, DK_T, DV_T, DB_T (dbias),
 * HEAD_DIM, VALUE_DIM, VEC (keys a tile, and head-dim lanes: it divides both head dims), BM,
 * SPLIT, ROW_SPLIT, HAS_DBIAS, DBIAS_MODE (Bias), IDX and the mask's; TILED, and with it
 * SLICES, BLK and GROUP_MAX (Tiles).
 */
#ifndef CLATTN_COMMON_CL
#include "common.cl"
#endif
#ifndef CLATTN_MASK_CL
#include "mask.cl"
#endif

#ifndef BM
#define BM 4
#endif
#ifndef DB_T
#define DB_T f32
#endif
#ifndef HAS_DBIAS
#define HAS_DBIAS 0
#endif
/* Splits of the key axis in the queries pass (SPLIT 1): each work-item (tiles: group) takes one
 * of `splits` chunks of `chunk` keys (in the lanes kernels a multiple of VEC: they walk whole
 * key tiles) and writes its partial dQ to `part`; backward_merge sums them in split order. */
#ifndef SPLIT
#define SPLIT 0
#endif
#if SPLIT
#define SPLITS splits
#else
#define SPLITS 1
#endif
/* Splits of the query rows in the keys pass (ROW_SPLIT 1): each work-item (tiles: group) takes
 * one of `row_splits` runs of the row blocks of its kv head's query heads and writes its partial
 * dK and dV to `part`; backward_keys_merge sums them in split order. Both counts are arguments,
 * not build options, so that every count past one shares a program (as in attention.cl: each
 * count built its own, seconds on PoCL). */
#ifndef ROW_SPLIT
#define ROW_SPLIT 0
#endif
#if ROW_SPLIT
#define ROW_SPLITS row_splits
#else
#define ROW_SPLITS 1
#endif
/* The partial dK and dV row (HEAD_DIM then VALUE_DIM floats) of key j of (batch, kv head) bhk
 * in row split `split`: a key's splits side by side, which the merge reads in order. Expects
 * part, part_off, Sk and row_splits in scope. */
#define KEY_PARTIAL(bhk, j, split)                                                                 \
    (part + part_off +                                                                             \
     (((IDX)(bhk) * (IDX)Sk + (IDX)(j)) * ROW_SPLITS + (IDX)(split)) * (HEAD_DIM + VALUE_DIM))
/* The row blocks [x, y) that split `split` of `splits` walks out of `runs`: runs of equal
 * length but the last (which may be short or empty). */
inline int2 row_run(int runs, int splits, int split) {
    const int per = (runs + splits - 1) / splits;
    return (int2)(min(split * per, runs), min(split * per + per, runs));
}
#ifndef TILED
#define TILED 0
#endif
#ifndef CLATTN_ROWS_CL
#include "rows.cl"
#endif

/* The lanes kernels' keys a tile: VEC (the tiles kernels' vectors run along the head dims). */
#if TILED
#define KEY_LANES 1
#else
#define KEY_LANES VEC
#endif

/* A tile of KEY_LANES keys as one value (a float when it is 1). */
#if KEY_LANES > 1
typedef floatV keys_t;
#define LOAD_KEYS(i, p)     CAT(vload, VEC)(i, p)
#define STORE_KEYS(v, i, p) CAT(vstore, VEC)(v, i, p)
#define ALL_KEYS(c)         all(c)
#else
typedef float keys_t;
#define LOAD_KEYS(i, p)     ((p)[i])
#define STORE_KEYS(v, i, p) ((p)[i] = (v))
#define ALL_KEYS(c)         (c)
#endif

/* Floats of one packed tile of K (HEAD_DIM x VEC) and of V. */
#define K_TILE (HEAD_DIM * VEC)
#define V_TILE (VALUE_DIM * VEC)

/* The masked scores of keys j0 .. j0 + VEC - 1 for one query row, from their raw dots x. A tile
 * that ends past Sk is masked key by key, so that no mask tensor is read past its end. */
inline keys_t tile_mask(const mask_params *p, const mask_row *r, int j0, int Sk, keys_t x) {
#if KEY_LANES > 1
    if (j0 + VEC <= Sk) return mask_chunk_score(p, r, j0, x);
#endif
    float lanes[KEY_LANES];
    STORE_KEYS(x, 0, lanes);
    for (int e = 0; e < KEY_LANES; ++e)
        lanes[e] = j0 + e < Sk ? mask_score(p, r, j0 + e, lanes[e]) : -INFINITY;
    return LOAD_KEYS(0, lanes);
}

/* ds/dx at raw dots x: the scale, times the softcap's tanh slope. */
inline keys_t score_slope(const mask_params *p, keys_t x) {
#if HAS_SOFTCAP
    const keys_t u = tanh(p->scale * x / p->softcap);
    return p->scale * (1.0f - u * u);
#else
    return (keys_t)p->scale;
#endif
}

/* dS times ds/dx for one row against a tile: 0 wherever P is not positive (masked, underflowed),
 * so that nothing an invisible position holds reaches a gradient. */
inline keys_t tile_grad(const mask_params *p, keys_t x, keys_t pr, keys_t dp, float delta) {
    const keys_t ds = pr * (dp - delta) * score_slope(p, x);
    return select((keys_t)0.0f, ds, pr > (keys_t)0.0f);
}

/* The row's stats: lse (-inf when dead) and D_i. */
#define ROW_STATS(b, h, i) (stats + 2 * (((IDX)(b)*Hq + (IDX)(h)) * (IDX)Sq + (IDX)(i)))

/* Loads query row i of q and dO as floats into qs[t] and dos[t] when the row is live, else
 * zeros (a dead row's data is never read). */
#define LOAD_QUERY_ROWS(t, i, live)                                                                \
    do {                                                                                           \
        for (int d = 0; d < HEAD_DIM; ++d)                                                         \
            qs[t][d] = (live) ? CAT(load_, Q_T)(q, AT(q, b, h, i, d)) : 0.0f;                      \
        for (int e = 0; e < VALUE_DIM; ++e)                                                        \
            dos[t][e] = (live) ? CAT(load_, DO_T)(dout, AT(dout, b, h, i, e)) : 0.0f;              \
    } while (0)

/* The BM rows' scores s[k][t] and dP[k][t] against n packed tiles (kt[k], vt[k]): both sums in
 * one loop over the dims they share, then the longer one's rest, so that each step has 2 BM n
 * independent FMAs (a loop of one tile's BM scores alone waits on the FMA's latency: PoCL's code
 * for BM = 4 issued one FMA a cycle where the core takes two), and each q and dO element
 * broadcast feeds n of them. Each sum's order is the same as alone. */
#define COMMON_DIM (HEAD_DIM < VALUE_DIM ? HEAD_DIM : VALUE_DIM)
#define SPAN_PRODUCTS(n)                                                                           \
    do {                                                                                           \
        UNROLL for (int k = 0; k < (n); ++k) UNROLL for (int t = 0; t < BM; ++t)                   \
            s[k][t] = dp[k][t] = 0.0f;                                                             \
        for (int d = 0; d < COMMON_DIM; ++d) {                                                     \
            UNROLL for (int k = 0; k < (n); ++k) {                                                 \
                const keys_t kd = LOAD_KEYS(d, kt[k]), vd = LOAD_KEYS(d, vt[k]);                   \
                UNROLL for (int t = 0; t < BM; ++t) {                                              \
                    s[k][t] = fma((keys_t)qs[t][d], kd, s[k][t]);                                  \
                    dp[k][t] = fma((keys_t)dos[t][d], vd, dp[k][t]);                               \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int d = COMMON_DIM; d < HEAD_DIM; ++d) {                                              \
            UNROLL for (int k = 0; k < (n); ++k) {                                                 \
                const keys_t kd = LOAD_KEYS(d, kt[k]);                                             \
                UNROLL for (int t = 0; t < BM; ++t) s[k][t] = fma((keys_t)qs[t][d], kd, s[k][t]);  \
            }                                                                                      \
        }                                                                                          \
        for (int e = COMMON_DIM; e < VALUE_DIM; ++e) {                                             \
            UNROLL for (int k = 0; k < (n); ++k) {                                                 \
                const keys_t ve = LOAD_KEYS(e, vt[k]);                                             \
                UNROLL for (int t = 0; t < BM; ++t)                                                \
                    dp[k][t] = fma((keys_t)dos[t][e], ve, dp[k][t]);                               \
            }                                                                                      \
        }                                                                                          \
    } while (0)

__kernel void backward_rows(TENSOR_PARAMS(O_T, o), TENSOR_PARAMS(DO_T, dout),
                            __global const float *lse, IDX lse_off, IDX lse_s1, IDX lse_s2,
                            IDX lse_s3, __global float *stats, int B, int Hq, int Sq) {
    const int row = (int)get_global_id(0);
    if (row >= B * Hq * Sq) return;
    const int i = row % Sq, bh = row / Sq, h = bh % Hq, b = bh / Hq;
    const float m = lse[lse_off + (IDX)b * lse_s1 + (IDX)h * lse_s2 + (IDX)i * lse_s3];
    const bool live = m > -INFINITY && m < INFINITY;
    float delta = 0.0f;
    if (live) {
        lane_t ov[LANES(VALUE_DIM)], gv[LANES(VALUE_DIM)], acc = 0.0f;
        LOAD_ROW(O_T, o, AT(o, b, h, i, 0), o_s3, VALUE_DIM, ov);
        LOAD_ROW(DO_T, dout, AT(dout, b, h, i, 0), dout_s3, VALUE_DIM, gv);
        for (int c = 0; c < LANES(VALUE_DIM); ++c) acc = fma(ov[c], gv[c], acc);
        delta = DOT_FINISH(acc);
    }
    __global float *at = ROW_STATS(b, h, i);
    at[0] = live ? m : -INFINITY;
    at[1] = delta;
}

#if !TILED
/* packed + pack_off holds K's tiles of every (batch, kv head), then V's: a work-item per
 * (batch, kv head, tile, d), d over HEAD_DIM then VALUE_DIM, VEC floats each. */
__kernel void backward_pack(TENSOR_PARAMS(K_T, k), TENSOR_PARAMS(V_T, v), __global float *packed,
                            IDX pack_off, int B, int Hkv, int Sk, MASK_PARAMS) {
    const int tiles = (Sk + VEC - 1) / VEC;
    const IDX item = (IDX)get_global_id(0), dims = HEAD_DIM + VALUE_DIM;
    if (item >= (IDX)B * Hkv * tiles * dims) return;
    const int d = (int)(item % dims);
    const IDX unit = item / dims; /* (batch, kv head, tile) */
    const int tile = (int)(unit % tiles), bh = (int)(unit / tiles), h = bh % Hkv, b = bh / Hkv;
    MASK_PACK(p);
    const int keys = mask_key_length(&p, b, Sk);
    __global float *out = packed + pack_off;
    if (d < HEAD_DIM) {
        out += (unit * HEAD_DIM + (IDX)d) * VEC;
        for (int e = 0; e < VEC; ++e) {
            const int j = tile * VEC + e;
            out[e] = j < keys ? CAT(load_, K_T)(k, AT(k, b, h, j, d)) : 0.0f;
        }
    } else {
        out += (IDX)B * Hkv * tiles * K_TILE + (unit * VALUE_DIM + (IDX)(d - HEAD_DIM)) * VEC;
        for (int e = 0; e < VEC; ++e) {
            const int j = tile * VEC + e;
            out[e] = j < keys ? CAT(load_, V_T)(v, AT(v, b, h, j, d - HEAD_DIM)) : 0.0f;
        }
    }
}

#endif /* !TILED */

/* Row i of (b, h): its mask row, lse and D_i; whether it is inside Sq and live. */
inline bool row_start(const mask_params *p, __global const float *stats, int b, int h, int i,
                      int Hq, int Sq, int Sk, mask_row *r, float *lse, float *delta) {
    *r = mask_row_start(p, b, h, min(i, Sq - 1), Sq, Sk);
    __global const float *at = ROW_STATS(b, h, min(i, Sq - 1));
    *lse = at[0], *delta = at[1];
    return i < Sq && *lse != -INFINITY;
}

/* P of a row against a tile: 0 where the score is masked (and for a dead row, whose lse is
 * -inf). */
inline keys_t tile_weights(keys_t x, float lse) {
    return select(exp(x - lse), (keys_t)0.0f, x == (keys_t)(-INFINITY));
}

/*
 * Bias. dbias has shape n0 x n1 x n2 x n3, each dim the scores' or 1 (summed over). Its element
 * is the sum of dS_ij over the pairs it broadcasts to, and the keys passes (a work-item per key,
 * or tile of keys, of one (batch, kv head), walking the rows of its query heads, or its row
 * split's run of them) meet each pair once, so they put dS in place as they go (DBIAS_MODE,
 * chosen by the host's plan_bias):
 *
 *   0  nothing: no dbias, or a bias that is one value along the keys (n3 = 1), which shifts a
 *      row's logits alike: its gradient, the sum of the row's dS, is exactly 0 (P sums to 1),
 *      and backward_bias_merge writes it as such rather than as the rounding of that sum
 *   1  each element is one pair's (no broadcast dim sums any): the pass stores every pair's dS
 *      into dbias, 0 where the pair is hidden (its block skipped, its row dead)
 *   2  the broadcast dims sum pairs of several work-items: each adds its visible pairs into its
 *      own f32 replica of dbias, one per batch where n0 = 1, per kv head where n1 = 1, and per
 *      row split (bias_splits) where an element's rows may fall in several splits (a key bias;
 *      the host does not split rows that a kv head's query heads share), all zeroed by
 *      backward_bias_clear, and
 *      backward_bias_merge sums the replicas in order. The pairs of one element that one
 *      work-item meets (its kv head's query heads, a key bias's rows) it adds in walk order (the
 *      lanes kernels sum a key bias's BM rows of a block first).
 *
 * No two work-items ever write one place, so there are no atomics and the bits are the same
 * from run to run. A replica's rows are BIAS_ROW floats (Sk rounded up to the keys a tile), so
 * that a lanes work-item writes whole vectors that no other work-item touches.
 */
#ifndef DBIAS_MODE
#define DBIAS_MODE 0
#endif
#define BIAS_ROW(Sk)  (((Sk) + KEY_LANES - 1) / KEY_LANES * KEY_LANES)
#define BIAS_STORES   (DBIAS_MODE == 1) /* every pair, 0 where hidden */

#if DBIAS_MODE > 0
/* the keys passes' last parameters: dbias, the replicas, dbias's dims, the row splits apart */
#define KEYS_BIAS_PARAMS                                                                           \
    , OUT_PARAMS(DB_T, db), __global float *bpart, IDX bpart_off, int n0, int n1, int n2, int n3, \
        int bias_splits

/* The replica of (batch b, kv head hk, row split) (DBIAS_MODE 2). */
inline int bias_replica(int n0, int n1, int Hkv, int splits, int b, int hk, int split) {
    const int rb = n0 > 1 ? 0 : b, rk = n1 > 1 ? 0 : hk, heads = n1 > 1 ? 1 : Hkv;
    return (rb * heads + rk) * splits + (splits > 1 ? split : 0);
}

/* Where pair (b, h, i, j) puts its dS: (1) its element of dbias, (2) the element in the replica
 * of (b, hk, split). Expects the kernel's KEYS_BIAS_PARAMS, Hkv and Sk in scope. */
#define BIAS_ELEMENT(b, h, i, j) AT(db, n0 > 1 ? (b) : 0, n1 > 1 ? (h) : 0, n2 > 1 ? (i) : 0, j)
#define BIAS_PARTIAL(b, h, hk, split, i, j)                                                        \
    (bpart + bpart_off +                                                                           \
     ((((IDX)bias_replica(n0, n1, Hkv, bias_splits, b, hk, split) * n0 + (n0 > 1 ? (b) : 0)) *    \
           n1 +                                                                                    \
       (n1 > 1 ? (h) : 0)) *                                                                       \
          n2 +                                                                                     \
      (n2 > 1 ? (i) : 0)) *                                                                        \
         (IDX)BIAS_ROW(Sk) +                                                                       \
     (IDX)(j))

/* dS of a tile of keys (keys_t) from P, dP and D_i: 0 where P is not positive. */
#define BIAS_TERM(pr, dp, delta) select((keys_t)0.0f, (pr) * ((dp) - (delta)), (pr) > (keys_t)0.0f)

/* Puts one pair's dS in place: stores it (1) or adds it (2). */
#if DBIAS_MODE == 1
#define BIAS_PUT(b, h, hk, split, i, j, term) CAT(store_, DB_T)(db, BIAS_ELEMENT(b, h, i, j), term)
#else
#define BIAS_PUT(b, h, hk, split, i, j, term) (*BIAS_PARTIAL(b, h, hk, split, i, j) += (term))
#endif

/* The same for a tile of KEY_LANES keys from key j0 of row i (the lanes kernels): (1) key by key
 * up to Sk, (2) as one vector in the padded replica row. */
#if DBIAS_MODE == 1
#define BIAS_PUT_TILE(b, h, hk, split, i, j0, terms)                                               \
    do {                                                                                           \
        float lanes_[KEY_LANES];                                                                   \
        STORE_KEYS(terms, 0, lanes_);                                                              \
        for (int e_ = 0; e_ < KEY_LANES && (j0) + e_ < Sk; ++e_)                                   \
            BIAS_PUT(b, h, hk, split, i, (j0) + e_, lanes_[e_]);                                   \
    } while (0)
#else
#define BIAS_PUT_TILE(b, h, hk, split, i, j0, terms)                                               \
    do {                                                                                           \
        __global float *at_ = BIAS_PARTIAL(b, h, hk, split, i, j0);                                \
        STORE_KEYS(LOAD_KEYS(0, at_) + (terms), 0, at_);                                           \
    } while (0)
#endif
#else
#define KEYS_BIAS_PARAMS
#endif

#if !TILED
/* The lanes of `lanes` (key j0 + e in lane e) into element c of their keys' rows of p (dk, dv),
 * or (split rows) into element `at` of this split's partial (dK, dV) rows, which
 * backward_keys_merge sums. Expects backward_keys' names in scope. */
#if ROW_SPLIT
#define PUT_KEY_GRADS(T, p, j0, c, at)                                                             \
    for (int e = 0; e < VEC && (j0) + e < Sk; ++e) KEY_PARTIAL(bhk, (j0) + e, split)[at] = lanes[e]
#else
#define PUT_KEY_GRADS(T, p, j0, c, at)                                                             \
    for (int e = 0; e < VEC && (j0) + e < Sk; ++e)                                                 \
    CAT(store_, T)(p, AT(p, b, hk, (j0) + e, c), lanes[e])
#endif

/* A keys work-item's tiles (KEY_TILES consecutive tiles of VEC keys): each q and dO row it loads
 * and each element of them it broadcasts feeds every tile, so that the dK and dV update (whose
 * accumulators live in memory: 2 KEY_TILES loads and stores per BM KEY_TILES FMAs, beside BM
 * broadcasts) and the products issue fewer loads per FMA. A tile past the last is the last
 * again, read and never written. */
#ifndef KEY_TILES
#define KEY_TILES 2
#endif

/* acc[k][c] += sum over the BM rows of rows[t][c] w[k][t], c < n, for every tile k. */
#define SPAN_UPDATE(acc, rows, w, n)                                                               \
    for (int c = 0; c < (n); ++c) {                                                                \
        keys_t r[BM];                                                                              \
        UNROLL for (int t = 0; t < BM; ++t) r[t] = (keys_t)rows[t][c];                             \
        UNROLL for (int k = 0; k < KEY_TILES; ++k) {                                               \
            keys_t sum = acc[k][c];                                                                \
            UNROLL for (int t = 0; t < BM; ++t) sum = fma(r[t], w[k][t], sum);                     \
            acc[k][c] = sum;                                                                       \
        }                                                                                          \
    }

__kernel void backward_keys(TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(DO_T, dout), OUT_PARAMS(DK_T, dk),
                            OUT_PARAMS(DV_T, dv), __global const float *stats,
                            __global const float *packed, IDX pack_off, int B, int Hq, int Hkv,
                            int Sq, int Sk, __global float *part, IDX part_off,
                            int row_splits, MASK_PARAMS KEYS_BIAS_PARAMS) {
    const int tiles = (Sk + VEC - 1) / VEC, spans = (tiles + KEY_TILES - 1) / KEY_TILES;
    const int item = (int)get_global_id(0);
    if (item >= B * Hkv * spans * ROW_SPLITS) return;
    const int split = item % ROW_SPLITS, unit = item / ROW_SPLITS;
    const int span = unit % spans, bhk = unit / spans, hk = bhk % Hkv, b = bhk / Hkv;
    const int group = Hq / Hkv;
    int j0[KEY_TILES];
    __global const float *kt[KEY_TILES], *vt[KEY_TILES];
    UNROLL for (int k = 0; k < KEY_TILES; ++k) {
        const int tile = span * KEY_TILES + k;
        const IDX at = (IDX)bhk * tiles + min(tile, tiles - 1);
        j0[k] = tile * VEC;
        kt[k] = packed + pack_off + at * K_TILE;
        vt[k] = packed + pack_off + (IDX)B * Hkv * tiles * K_TILE + at * V_TILE;
    }
    /* the row blocks of the group's query heads, head by head, and the split's run of them */
    const int blocks = (Sq + BM - 1) / BM;
    const int2 run = row_run(group * blocks, ROW_SPLITS, split);
    MASK_PACK(p);

    keys_t gk[KEY_TILES][HEAD_DIM], gv[KEY_TILES][VALUE_DIM];
    UNROLL for (int k = 0; k < KEY_TILES; ++k) {
        for (int d = 0; d < HEAD_DIM; ++d) gk[k][d] = 0.0f;
        for (int e = 0; e < VALUE_DIM; ++e) gv[k][e] = 0.0f;
    }
    for (int u = run.x; u < run.y; ++u) {
        const int h = hk * group + u / blocks, i0 = u % blocks * BM;
        mask_row r[BM];
        float lse[BM], delta[BM];
        bool row_live[BM], live[KEY_TILES][BM], any = false;
        UNROLL for (int t = 0; t < BM; ++t) {
            row_live[t] = row_start(&p, stats, b, h, i0 + t, Hq, Sq, Sk, &r[t], &lse[t], &delta[t]);
            UNROLL for (int k = 0; k < KEY_TILES; ++k) {
                live[k][t] = row_live[t] && j0[k] < r[t].hi && j0[k] + VEC > r[t].lo;
                any = any || live[k][t];
            }
        }
        if (!any) {
#if BIAS_STORES
            UNROLL for (int k = 0; k < KEY_TILES; ++k) UNROLL for (int t = 0; t < BM; ++t) {
                if (i0 + t < Sq && j0[k] < Sk)
                    BIAS_PUT_TILE(b, h, hk, split, i0 + t, j0[k], (keys_t)0.0f);
            }
#endif
            continue;
        }
        float qs[BM][HEAD_DIM], dos[BM][VALUE_DIM];
        UNROLL for (int t = 0; t < BM; ++t) LOAD_QUERY_ROWS(t, i0 + t, row_live[t]);
        keys_t s[KEY_TILES][BM], dp[KEY_TILES][BM], pr[KEY_TILES][BM], gs[KEY_TILES][BM];
        SPAN_PRODUCTS(KEY_TILES);
        UNROLL for (int k = 0; k < KEY_TILES; ++k) UNROLL for (int t = 0; t < BM; ++t) {
            const keys_t x = live[k][t] ? tile_mask(&p, &r[t], j0[k], Sk, s[k][t])
                                        : (keys_t)(-INFINITY);
            pr[k][t] = tile_weights(x, lse[t]);
            gs[k][t] = tile_grad(&p, s[k][t], pr[k][t], dp[k][t], delta[t]);
        }
        UNROLL for (int k = 0; k < KEY_TILES; ++k) {
            if (j0[k] >= Sk) continue;
#if BIAS_STORES
            UNROLL for (int t = 0; t < BM; ++t) {
                if (i0 + t < Sq)
                    BIAS_PUT_TILE(b, h, hk, split, i0 + t, j0[k],
                                  BIAS_TERM(pr[k][t], dp[k][t], delta[t]));
            }
#elif DBIAS_MODE == 2
            keys_t rows_sum = 0.0f; /* n2 = 1: the block's rows, one element */
            UNROLL for (int t = 0; t < BM; ++t) {
                const keys_t term = BIAS_TERM(pr[k][t], dp[k][t], delta[t]);
                if (n2 > 1 && live[k][t]) BIAS_PUT_TILE(b, h, hk, split, i0 + t, j0[k], term);
                rows_sum += term;
            }
            if (n2 == 1) BIAS_PUT_TILE(b, h, hk, split, 0, j0[k], rows_sum);
#endif
        }
        SPAN_UPDATE(gv, dos, pr, VALUE_DIM);
        SPAN_UPDATE(gk, qs, gs, HEAD_DIM);
    }

    /* lane e of each vector is key j0 + e */
    UNROLL for (int k = 0; k < KEY_TILES; ++k) {
        float lanes[VEC];
        for (int d = 0; d < HEAD_DIM; ++d) {
            STORE_KEYS(gk[k][d], 0, lanes);
            PUT_KEY_GRADS(DK_T, dk, j0[k], d, d);
        }
        for (int c = 0; c < VALUE_DIM; ++c) {
            STORE_KEYS(gv[k][c], 0, lanes);
            PUT_KEY_GRADS(DV_T, dv, j0[k], c, HEAD_DIM + c);
        }
    }
}

/* g[t] += gs[t][jj] K row j0 + jj for the BM rows, each where `take` holds (t in scope).
 * Expects backward_queries' names in scope. */
#define ADD_KEY_ROW(jj, take)                                                                      \
    do {                                                                                           \
        lane_t kr[LANES(HEAD_DIM)];                                                                \
        LOAD_ROW(K_T, k, AT(k, b, hk, j0 + (jj), 0), k_s3, HEAD_DIM, kr);                          \
        UNROLL for (int t = 0; t < BM; ++t) {                                                      \
            if (take) {                                                                            \
                UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c) g[t][c] =                         \
                    fma((lane_t)gs[t][jj], kr[c], g[t][c]);                                        \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* The queries pass's key tiles a step (the forward's LANE_TILES, from its tuning row): each q
 * and dO element it broadcasts feeds that many tiles' FMAs. */
#ifndef LANE_TILES
#define LANE_TILES 2
#endif

__kernel void backward_queries(TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(K_T, k),
                               TENSOR_PARAMS(DO_T, dout), OUT_PARAMS(DQ_T, dq),
                               __global const float *stats, __global const float *packed,
                               IDX pack_off, int B, int Hq, int Hkv, int Sq, int Sk,
                               __global float *part, IDX part_off, int chunk, int splits,
                               MASK_PARAMS) {
    const int blocks = (Sq + BM - 1) / BM, tiles = (Sk + VEC - 1) / VEC;
    const int item = (int)get_global_id(0);
    if (item >= B * Hq * blocks * SPLITS) return;
    const int split = item % SPLITS, unit = item / SPLITS;
    const int i0 = (unit % blocks) * BM, bh = unit / blocks, h = bh % Hq, b = bh / Hq;
    const int hk = h / (Hq / Hkv);
    __global const float *kp = packed + pack_off + (IDX)(b * Hkv + hk) * tiles * K_TILE;
    __global const float *vp = packed + pack_off + (IDX)B * Hkv * tiles * K_TILE +
                               (IDX)(b * Hkv + hk) * tiles * V_TILE;
    MASK_PACK(p);

    mask_row r[BM];
    float lse[BM], delta[BM], qs[BM][HEAD_DIM], dos[BM][VALUE_DIM];
    bool live[BM];
    int lo = Sk, hi = 0;
    UNROLL for (int t = 0; t < BM; ++t) {
        const int i = i0 + t;
        live[t] = row_start(&p, stats, b, h, i, Hq, Sq, Sk, &r[t], &lse[t], &delta[t]) &&
                  r[t].lo < r[t].hi;
        if (live[t]) lo = min(lo, r[t].lo), hi = max(hi, r[t].hi);
        LOAD_QUERY_ROWS(t, i, live[t]);
    }
#if SPLIT
    lo = max(lo, split * chunk), hi = min(hi, split * chunk + chunk);
#endif
    lane_t g[BM][LANES(HEAD_DIM)];
    UNROLL for (int t = 0; t < BM; ++t) {
        UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c) g[t][c] = 0.0f;
    }

    /* LANE_TILES tiles a step; a tile at or past hi reads the step's first again (its scores
     * are masked, its keys never added) */
    for (int j0 = lo / VEC * VEC; j0 < hi; j0 += LANE_TILES * VEC) {
        __global const float *kt[LANE_TILES], *vt[LANE_TILES];
        UNROLL for (int k = 0; k < LANE_TILES; ++k) {
            const IDX tile = (IDX)((j0 + k * VEC < hi ? j0 + k * VEC : j0) / VEC);
            kt[k] = kp + tile * K_TILE, vt[k] = vp + tile * V_TILE;
        }
        keys_t s[LANE_TILES][BM], dp[LANE_TILES][BM];
        SPAN_PRODUCTS(LANE_TILES);
        float gs[BM][LANE_TILES * VEC];
        bool dense = true; /* every row sees every key of the step below hi */
        UNROLL for (int t = 0; t < BM; ++t) UNROLL for (int k = 0; k < LANE_TILES; ++k) {
            const int jk = j0 + k * VEC;
            keys_t x = (keys_t)(-INFINITY);
            if (live[t] && jk < r[t].hi && jk + VEC > r[t].lo)
                x = tile_mask(&p, &r[t], jk, Sk, s[k][t]);
            dense = dense && (jk >= hi || ALL_KEYS(x != (keys_t)(-INFINITY)));
            STORE_KEYS(tile_grad(&p, s[k][t], tile_weights(x, lse[t]), dp[k][t], delta[t]), k,
                       gs[t]);
        }
        /* dQ += dS K. A step some row cannot see all of skips the zero weights, so that
         * whatever an invisible K row holds never reaches dQ; a dense step (inside Sk: most of
         * them) takes every weight untested, which leaves the loop FMAs and their loads (the
         * test in it took two thirds of its instructions). */
        if (dense) {
            for (int jj = 0; jj < LANE_TILES * VEC && j0 + jj < hi; ++jj) ADD_KEY_ROW(jj, true);
        } else {
            for (int jj = 0; jj < LANE_TILES * VEC && j0 + jj < hi; ++jj)
                ADD_KEY_ROW(jj, gs[t][jj] != 0.0f);
        }
    }

    UNROLL for (int t = 0; t < BM; ++t) {
        if (i0 + t >= Sq) continue;
        float row[HEAD_DIM];
        UNROLL for (int c = 0; c < LANES(HEAD_DIM); ++c) {
#if VEC > 1
            CAT(vstore, VEC)(g[t][c], c, row);
#else
            row[c] = g[t][c];
#endif
        }
#if SPLIT
        __global float *at =
            part + part_off + (((IDX)bh * (IDX)Sq + (IDX)(i0 + t)) * SPLITS + split) * HEAD_DIM;
        for (int d = 0; d < HEAD_DIM; ++d) at[d] = row[d];
        continue;
#endif
        for (int d = 0; d < HEAD_DIM; ++d)
            CAT(store_, DQ_T)(dq, AT(dq, b, h, i0 + t, d), row[d]);
    }
}

#endif /* !TILED */


#if TILED
/*
 * Tiles: the GPU kernels. A work-item holds one key (keys pass) or one query (queries pass) and
 * a slice of its head dims, HEAD_DIM / SLICES of k (or q) and of dK (dQ), VALUE_DIM / SLICES of v
 * (dO) and dV, as lane vectors of VEC (which divides both slices), so that what it holds stays in
 * registers (at most BWD_SLICE dims of each where a divisor of both head dims allows); the SLICES
 * work-items of a key (query) add their partial dots
 * through local memory, in slice order (the same bits in each). The other side (BLK queries
 * with their dO, or BLK keys with their V) is staged in local memory by the whole group with
 * coalesced loads, and every work-item of a slice reads the same lane vector at once (a
 * broadcast, one vector load for VEC FMAs), as attention_tiles reads its K and V tiles. The
 * products are those of the lanes kernels above; the summation orders differ. The pairs' dots
 * go through local memory (red) even with one slice, so that no private array is indexed by the
 * pair (GPUs keep such arrays in slow memory unless every loop over them is unrolled).
 *
 *   backward_keys_tiles     a group per GROUP / SLICES keys of one (batch, kv head) and row
 *                           split: every block of BLK queries of each of its query heads (the
 *                           split's run of them, in that order) that sees one of them
 *   backward_keys_merge     (ROW_SPLIT) a work-item per element of dK and dV: the sum of
 *                           the row splits' partials, in split order
 *   backward_queries_tiles  a group per GROUP / SLICES queries of one (batch, query head) and
 *                           key split: the key tiles its rows see, BLK keys a tile; the groups
 *                           in the forward's order (`order`: unit_place, longest first under
 *                           a causal mask where the row's LPT asks)
 *
 * A work-item's slice is local id / (keys or queries a group), so that a warp of 32 reads one
 * slice when a group has 32 or more keys (queries) a slice.
 */
#define SLICE_D (HEAD_DIM / SLICES)  /* a slice's head dims of q and k */
#define SLICE_V (VALUE_DIM / SLICES) /* and of v and dO */

/* The dots of pair t (q.k and dO.v) from the partials each work-item of the pair's key (query)
 * wrote to red[2t][lid] and red[2t + 1][lid], added in slice order: the same bits in each slice.
 * `width`: keys (queries) a group, `at`: the work-item's key (query) in it. */
inline float2 pair_dots(__local const float *red, int t, int width, int at) {
    const int size = (int)get_local_size(0);
    __local const float *x = red + 2 * t * size + at, *y = x + size;
    float2 dots = (float2)(x[0], y[0]);
    for (int c = 1; c < SLICES; ++c) dots += (float2)(x[c * width], y[c * width]);
    return dots;
}

/* dS times ds/dx of a visible pair from its dots (q.k, dO.v): 0, and *pr 0, where the score is
 * masked or its weight underflows. */
inline float pair_grad(const mask_params *p, const mask_row *r, int j, float2 dots, float lse,
                       float delta, float *pr) {
    const float s = mask_score(p, r, j, dots.x);
    *pr = s == -INFINITY ? 0.0f : exp(s - lse);
    return tile_grad(p, dots.x, *pr, dots.y, delta);
}

/* n elements (a row's slice, n a multiple of VEC) of a [.., n] row at `at` into `out`, or
 * zeros when `take` is false. */
#define LOAD_SLICE(T, p, at, n, take, out)                                                         \
    do {                                                                                           \
        if (take) {                                                                                \
            LOAD_ROW(T, p, at, p##_s3, n, out);                                                    \
        } else {                                                                                   \
            UNROLL for (int c_ = 0; c_ < LANES(n); ++c_) out[c_] = 0.0f;                           \
        }                                                                                          \
    } while (0)

/* Rows r0 .. r0 + BLK - 1 of head (b, h) of a [.., width n] tensor into `tile` as lane vectors,
 * row-major; rows for which `take` (of the row's index t) is false read as 0. */
#define STAGE_ROWS(T, p, b, h, r0, n, take, tile)                                                  \
    for (int e = (int)get_local_id(0); e < BLK * LANES(n); e += (int)get_local_size(0)) {          \
        const int t = e / LANES(n);                                                                \
        tile[e] = (take) ? LOAD_LANES(T, p, AT(p, b, h, (r0) + t, e % LANES(n) * VEC), p##_s3)     \
                         : (lane_t)0.0f;                                                           \
    }

/* The partial dot of a held slice `mine` with row t of a staged tile, from lane vector `first`. */
#define SLICE_DOT(mine, tile, t, n, first, out)                                                    \
    do {                                                                                           \
        lane_t acc_ = 0.0f;                                                                        \
        UNROLL for (int c_ = 0; c_ < LANES((n) / SLICES); ++c_) acc_ =                         \
            fma(mine[c_], tile[(t)*LANES(n) + (first) + c_], acc_);                                \
        out = DOT_FINISH(acc_);                                                                    \
    } while (0)

/* Each work-item's partial dots of its held slices (mk with the staged rows of tk, mv with those
 * of tv) for the BLK rows, into red, then (SLICES > 1) the barrier after which pair_dots reads
 * the other slices' (one slice reads only its own). Expects lid, size, cd and cv in scope. */
#if SLICES > 1
#define SLICES_MET() barrier(CLK_LOCAL_MEM_FENCE)
#else
#define SLICES_MET() (void)0
#endif
#define STAGED_DOTS(mk, tk, mv, tv)                                                                \
    do {                                                                                           \
        for (int t = 0; t < BLK; ++t) {                                                            \
            SLICE_DOT(mk, tk, t, HEAD_DIM, cd, red[2 * t * size + lid]);                           \
            SLICE_DOT(mv, tv, t, VALUE_DIM, cv, red[(2 * t + 1) * size + lid]);                    \
        }                                                                                          \
        SLICES_MET();                                                                              \
    } while (0)

/* acc += w * row t of a staged tile, over the held slice. */
#define SLICE_ADD(acc, w, tile, t, n, first)                                                       \
    UNROLL for (int c_ = 0; c_ < LANES((n) / SLICES); ++c_) acc[c_] =                              \
        fma((lane_t)(w), tile[(t)*LANES(n) + (first) + c_], acc[c_])

/* A held slice of n elements into row `at` of a [.., n] output. */
#define STORE_SLICE(T, p, at, n, acc)                                                              \
    do {                                                                                           \
        float row_[(n) / SLICES];                                                                  \
        UNROLL for (int c_ = 0; c_ < LANES((n) / SLICES); ++c_) STORE_VEC(acc[c_], c_, row_);      \
        UNROLL for (int e_ = 0; e_ < (n) / SLICES; ++e_)                                           \
            CAT(store_, T)(p, (at) + (IDX)e_ * p##_s3, row_[e_]);                                  \
    } while (0)
#if VEC > 1
#define STORE_VEC(v, c, row) CAT(vstore, VEC)(v, c, row)
#else
#define STORE_VEC(v, c, row) ((row)[c] = (v))
#endif

__kernel void backward_keys_tiles(TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(K_T, k),
                                  TENSOR_PARAMS(V_T, v), TENSOR_PARAMS(DO_T, dout),
                                  OUT_PARAMS(DK_T, dk), OUT_PARAMS(DV_T, dv),
                                  __global const float *stats, int B, int Hq, int Hkv, int Sq,
                                  int Sk, __global float *part, IDX part_off, int row_splits,
                                  MASK_PARAMS KEYS_BIAS_PARAMS) {
    __local lane_t qs[BLK * LANES(HEAD_DIM)], gos[BLK * LANES(VALUE_DIM)]; /* q and dO rows */
    __local float red[2 * BLK * GROUP_MAX]; /* each work-item's partial dots */
    __local mask_row rows[BLK];
    __local float row_lse[BLK], row_delta[BLK];
    __local int sees[BLK]; /* the row sees a key of the group */
    const int lid = (int)get_local_id(0), size = (int)get_local_size(0);
    const int width = size / SLICES, slice = lid / width, kk = lid % width;
    const int tiles = (Sk + width - 1) / width, unit = (int)get_group_id(0) / ROW_SPLITS;
    const int tile = unit % tiles, bhk = unit / tiles, hk = bhk % Hkv, b = bhk / Hkv;
    const int first = tile * width, last = min(first + width, Sk), j = first + kk;
    const int cd = slice * LANES(SLICE_D), cv = slice * LANES(SLICE_V), group = Hq / Hkv;
    /* the row blocks of the group's query heads, head by head, and the split's run of them */
    const int blocks = (Sq + BLK - 1) / BLK, split = (int)get_group_id(0) % ROW_SPLITS;
    const int2 run = row_run(group * blocks, ROW_SPLITS, split);
    MASK_PACK(p);

    lane_t kr[LANES(SLICE_D)], vr[LANES(SLICE_V)], gk[LANES(SLICE_D)], gv[LANES(SLICE_V)];
    LOAD_SLICE(K_T, k, AT(k, b, hk, j, cd * VEC), SLICE_D, j < Sk, kr);
    LOAD_SLICE(V_T, v, AT(v, b, hk, j, cv * VEC), SLICE_V, j < Sk, vr);
    UNROLL for (int c = 0; c < LANES(SLICE_D); ++c) gk[c] = 0.0f;
    UNROLL for (int c = 0; c < LANES(SLICE_V); ++c) gv[c] = 0.0f;
    for (int u = run.x; u < run.y; ++u) {
        const int h = hk * group + u / blocks, i0 = u % blocks * BLK;
        barrier(CLK_LOCAL_MEM_FENCE); /* everyone is done with the last block */
        for (int t = lid; t < BLK; t += size) {
            mask_row r;
            float lse, delta;
            const bool live = row_start(&p, stats, b, h, i0 + t, Hq, Sq, Sk, &r, &lse, &delta);
            rows[t] = r, row_lse[t] = lse, row_delta[t] = delta;
            sees[t] = live && r.lo < last && r.hi > first;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        bool any = false;
        for (int t = 0; t < BLK; ++t) any = any || sees[t];
        if (!any) { /* the same for the whole group */
#if BIAS_STORES
            for (int t = 0; t < BLK; ++t)
                if (slice == 0 && j < Sk && i0 + t < Sq) BIAS_PUT(b, h, hk, split, i0 + t, j, 0.0f);
#endif
            /* a barrier on this path too: PoCL 3.1 got dK wrong for all but the first key of
             * each group (one row a block, a keep mask) when the skip went straight to the
             * loop's first barrier (tiles_kernels_blocks_of_one_row_under_a_keep_mask;
             * reduced: tests/probes/barrier_skip.c) */
            barrier(CLK_LOCAL_MEM_FENCE);
            continue;
        }
        /* rows that see none of the group's keys read as 0: they add nothing */
        STAGE_ROWS(Q_T, q, b, h, i0, HEAD_DIM, sees[t], qs);
        STAGE_ROWS(DO_T, dout, b, h, i0, VALUE_DIM, sees[t], gos);
        barrier(CLK_LOCAL_MEM_FENCE);
        STAGED_DOTS(kr, qs, vr, gos);
        for (int t = 0; t < BLK; ++t) {
            const mask_row r = rows[t];
            float term = 0.0f; /* dbias's */
            if (sees[t] && j >= r.lo && j < r.hi) {
                float pr;
                const float2 dots = pair_dots(red, t, width, kk);
                const float gs = pair_grad(&p, &r, j, dots, row_lse[t], row_delta[t], &pr);
                if (pr > 0.0f) { /* what a hidden pair holds never counts */
                    term = pr * (dots.y - row_delta[t]);
                    SLICE_ADD(gv, pr, gos, t, VALUE_DIM, cv);
                    SLICE_ADD(gk, gs, qs, t, HEAD_DIM, cd);
                }
            }
#if BIAS_STORES
            if (slice == 0 && j < Sk && i0 + t < Sq) BIAS_PUT(b, h, hk, split, i0 + t, j, term);
#elif DBIAS_MODE == 2
            if (slice == 0 && term != 0.0f) BIAS_PUT(b, h, hk, split, i0 + t, j, term);
#endif
        }
    }
    if (j >= Sk) return;
#if ROW_SPLIT
    __global float *at = KEY_PARTIAL(bhk, j, split);
    UNROLL for (int c = 0; c < LANES(SLICE_D); ++c) STORE_VEC(gk[c], c, at + cd * VEC);
    UNROLL for (int c = 0; c < LANES(SLICE_V); ++c) STORE_VEC(gv[c], c, at + HEAD_DIM + cv * VEC);
#else
    STORE_SLICE(DK_T, dk, AT(dk, b, hk, j, cd * VEC), HEAD_DIM, gk);
    STORE_SLICE(DV_T, dv, AT(dv, b, hk, j, cv * VEC), VALUE_DIM, gv);
#endif
}

__kernel void backward_queries_tiles(TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(K_T, k),
                                     TENSOR_PARAMS(V_T, v), TENSOR_PARAMS(DO_T, dout),
                                     OUT_PARAMS(DQ_T, dq), __global const float *stats,
                                     int order, int B, int Hq, int Hkv, int Sq, int Sk,
                                     __global float *part, IDX part_off, int chunk, int splits,
                                     MASK_PARAMS) {
    __local lane_t ks[BLK * LANES(HEAD_DIM)], vs[BLK * LANES(VALUE_DIM)]; /* k and v rows */
    __local float red[2 * BLK * GROUP_MAX];
    __local int span[2];
    const int lid = (int)get_local_id(0), size = (int)get_local_size(0);
    const int width = size / SLICES, slice = lid / width, ii = lid % width;
    const int blocks = (Sq + width - 1) / width, unit = (int)get_group_id(0);
    const int2 place = unit_place(unit / SPLITS, blocks, B * Hq, order); /* (bh, block) */
    const int split = unit % SPLITS, bh = place.x;
    const int h = bh % Hq, b = bh / Hq, hk = h / (Hq / Hkv), i = place.y * width + ii;
    const int cd = slice * LANES(SLICE_D), cv = slice * LANES(SLICE_V);
    MASK_PACK(p);
    mask_row r;
    float lse, delta;
    bool live = row_start(&p, stats, b, h, i, Hq, Sq, Sk, &r, &lse, &delta);
#if SPLIT
    mask_row_clip(&r, split * chunk, split * chunk + chunk);
#endif
    live = live && r.lo < r.hi;
    const int2 keys = group_key_span(span, live ? r.lo : Sk, live ? r.hi : 0, Sk);

    lane_t qr[LANES(SLICE_D)], gor[LANES(SLICE_V)], g[LANES(SLICE_D)];
    LOAD_SLICE(Q_T, q, AT(q, b, h, i, cd * VEC), SLICE_D, live, qr);
    LOAD_SLICE(DO_T, dout, AT(dout, b, h, i, cv * VEC), SLICE_V, live, gor);
    UNROLL for (int c = 0; c < LANES(SLICE_D); ++c) g[c] = 0.0f;
    for (int j0 = keys.x; j0 < keys.y; j0 += BLK) {
        barrier(CLK_LOCAL_MEM_FENCE); /* everyone is done with the last tile */
        /* keys no row of the group sees read as 0 */
        STAGE_ROWS(K_T, k, b, hk, j0, HEAD_DIM, j0 + t < keys.y, ks);
        STAGE_ROWS(V_T, v, b, hk, j0, VALUE_DIM, j0 + t < keys.y, vs);
        barrier(CLK_LOCAL_MEM_FENCE);
        STAGED_DOTS(qr, ks, gor, vs);
        for (int t = 0; t < BLK; ++t) {
            const int j = j0 + t;
            if (!live || j < r.lo || j >= r.hi) continue;
            float pr;
            const float gs = pair_grad(&p, &r, j, pair_dots(red, t, width, ii), lse, delta, &pr);
            if (!(pr > 0.0f)) continue; /* what a hidden key holds never counts */
            SLICE_ADD(g, gs, ks, t, HEAD_DIM, cd);
        }
    }
    if (i >= Sq) return;
#if SPLIT
    __global float *at =
        part + part_off + (((IDX)bh * (IDX)Sq + (IDX)i) * SPLITS + split) * HEAD_DIM + cd * VEC;
    UNROLL for (int c = 0; c < LANES(SLICE_D); ++c) STORE_VEC(g[c], c, at);
#else
    STORE_SLICE(DQ_T, dq, AT(dq, b, h, i, cd * VEC), HEAD_DIM, g);
#endif
}
#endif /* TILED */

/* (split rows, either keys pass) a work-item per element of dK and dV: the sum of the row
 * splits' partials, in split order. */
#if ROW_SPLIT
__kernel void backward_keys_merge(__global const float *part, IDX part_off,
                                  OUT_PARAMS(DK_T, dk), OUT_PARAMS(DV_T, dv), int B, int Hkv,
                                  int Sk, int row_splits) {
    const size_t item = get_global_id(0);
    if (item >= (size_t)B * Hkv * Sk * (HEAD_DIM + VALUE_DIM)) return;
    const int d = (int)(item % (HEAD_DIM + VALUE_DIM)), row = (int)(item / (HEAD_DIM + VALUE_DIM));
    const int j = row % Sk, bhk = row / Sk, hk = bhk % Hkv, b = bhk / Hkv;
    __global const float *at = KEY_PARTIAL(bhk, j, 0) + d;
    float sum = 0.0f;
    for (int s = 0; s < ROW_SPLITS; ++s) sum += at[(IDX)s * (HEAD_DIM + VALUE_DIM)];
    if (d < HEAD_DIM)
        CAT(store_, DK_T)(dk, AT(dk, b, hk, j, d), sum);
    else
        CAT(store_, DV_T)(dv, AT(dv, b, hk, j, d - HEAD_DIM), sum);
}
#endif

#if SPLIT
__kernel void backward_merge(__global const float *part, IDX part_off, OUT_PARAMS(DQ_T, dq),
                             int B, int Hq, int Sq, int splits) {
    const size_t item = get_global_id(0);
    if (item >= (size_t)B * Hq * Sq * HEAD_DIM) return;
    const int d = (int)(item % HEAD_DIM), row = (int)(item / HEAD_DIM);
    const int i = row % Sq, bh = row / Sq, h = bh % Hq, b = bh / Hq;
    __global const float *at = part + part_off + (IDX)row * SPLITS * HEAD_DIM + (IDX)d;
    float sum = 0.0f;
    for (int s = 0; s < SPLITS; ++s) sum += at[(IDX)s * HEAD_DIM];
    CAT(store_, DQ_T)(dq, AT(dq, b, h, i, d), sum);
}
#endif

#if HAS_DBIAS
/* DBIAS_MODE 2: zeros into the `count` floats of the replicas. */
__kernel void backward_bias_clear(__global float *bpart, IDX bpart_off, IDX count) {
    const IDX item = (IDX)get_global_id(0);
    if (item < count) bpart[bpart_off + item] = 0.0f;
}

/* A work-item per MERGE_LANES elements along a row of dbias: the sum of their `replicas`
 * partials in replica order (rows of `row` floats), or 0 with none (a bias one value along the
 * keys). On CPUs (the lanes kernels: 16) the partials come in as vectors and the sums go out
 * element by element (dbias is any view): a work-item loop over a scalar sum is one PoCL does
 * not vectorize (4 GB/s). On GPUs (1) neighbouring work-items read and write neighbouring
 * elements, which their memory coalesces. */
#ifndef MERGE_LANES
#define MERGE_LANES 1
#endif
__kernel void backward_bias_merge(__global const float *bpart, IDX bpart_off,
                                  OUT_PARAMS(DB_T, db), int n0, int n1, int n2, int n3,
                                  int replicas, int row) {
    const int chunks = (n3 + MERGE_LANES - 1) / MERGE_LANES;
    const size_t item = get_global_id(0);
    if (item >= (size_t)n0 * n1 * n2 * chunks) return;
    const int e3 = (int)(item % chunks) * MERGE_LANES, line = (int)(item / chunks);
    const int e2 = line % n2, e1 = line / n2 % n1, e0 = line / n2 / n1;
    const int count = min(MERGE_LANES, n3 - e3);
    __global const float *at = bpart + bpart_off + (IDX)line * (IDX)row + (IDX)e3;
    const IDX stride = (IDX)n0 * n1 * n2 * (IDX)row;
    float sums[MERGE_LANES];
#if MERGE_LANES == 16
    if (count == MERGE_LANES) {
        float16 sum = 0.0f;
        for (int r = 0; r < replicas; ++r) sum += vload16(0, at + (IDX)r * stride);
        vstore16(sum, 0, sums);
    } else
#endif
    { /* one at a time (on CPUs the row's last elements: no load past them) */
        for (int e = 0; e < count; ++e) {
            float sum = 0.0f;
            for (int r = 0; r < replicas; ++r) sum += at[(IDX)r * stride + (IDX)e];
            sums[e] = sum;
        }
    }
    for (int e = 0; e < count; ++e) CAT(store_, DB_T)(db, AT(db, e0, e1, e2, e3 + e), sums[e]);
}
#endif
