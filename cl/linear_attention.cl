/*
 * Linear attention (Katharopoulos et al. 2020), docs/design.md (Ops, Linear attention):
 *
 *   out_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps),  S_i = sum_j phi(k_j) v_j^T,  z_i = sum_j
 * phi(k_j)
 *
 * over the keys j visible to query i: j < end_i, where end_i is cl/mask.cl's row end (the key
 * length, and i + off + 1 when causal; 0 for a query past its query length). A query that sees
 * no key gets 0.
 *
 * Per (batch, kv head) the keys are cut into `nchunks` chunks of `chunk` keys, and a state is
 * the pair (S, z): HEAD_DIM x VALUE_DIM floats of S, row-major, then HEAD_DIM of z (SLOT floats).
 * The scratch `states` holds nchunks + 1 of them per (batch, kv head). Four kernels run:
 *
 *   linear_features one work-item per key row below the key length, phi(k_j) into f32 scratch
 *                   `phik` [B,Hkv,Sk,HEAD_DIM] in VEC-wide vectors, so that the map runs once
 *                   per key, as vectors, for the states and (CAUSAL) the products within chunks.
 *   linear_states   one work-item per ROWS state rows of one chunk: the chunk's own sums over
 *                   its keys below the key length, into slot c + 1, from `phik`.
 *   linear_scan     one work-item per VEC lanes of a state row: slot c becomes the sum of the
 *                   chunks before c (slot 0: zero, or the caller's state with HAS_STATE), and
 *                   slot nchunks the total, which HAS_STATE writes back to the caller's state
 *                   (not CAUSAL: the total alone). A serial walk over the nchunks slots,
 *                   parallel over everything else.
 *   linear_outputs  one work-item per BM consecutive queries of one (batch, query head). Not
 *                   CAUSAL: every query reads the total. CAUSAL: the block reads the state of
 *                   the whole chunks its first query sees (slot end / chunk), then adds the rest
 *                   of its keys one by one, each query its own ones (the masked quadratic
 *                   product within a chunk): O(chunk) per query, so O(S) per head in all.
 *
 * On GPUs linear_states_tiles and linear_outputs_tiles (Tiles, below) take the places of
 * linear_states and linear_outputs (the host's TILES: not for the outputs of a call with fewer
 * queries than a block, nor where the compiler cannot run a tile kernel's group): the same sums
 * as products of work-group blocks. They map k themselves as they stage it (MAP_KEYS), so
 * linear_features runs only where a row kernel or the backward reads phik. A step of few tokens
 * (HAS_STATE, the host's RECURRENT) runs linear_recurrence alone (The recurrent step, below).
 *
 * Query head h reads kv head h / (Hq / Hkv) (MHA, GQA and MQA alike). Keys past a query's end
 * are never read for it, so whatever they hold (NaN, Inf) cannot reach its output, and changing
 * later keys changes no earlier output, bit for bit.
 *
 * Build options: Q_T, K_T, V_T, O_T (f32|f16|bf16), HEAD_DIM, VALUE_DIM, VEC (head-dim lanes),
 * ROWS (linear_states; divides HEAD_DIM), BM (linear_outputs), TR, TC, TS, BR, BC, BQ, MAP_KEYS,
 * ALIGNED (the tiles and linear_recurrence; ALIGNED: every row they load as lane vectors starts
 * on one), STEP_TOKENS, STEP_HEADS (linear_recurrence: the step's tokens, query heads per kv
 * head), FEATURE (0 elu(x)+1, 1 relu, 2 identity), CAUSAL, HAS_STATE, IDX, and the mask's (only
 * the lengths are used).
 */
#ifndef CLATTN_LINEAR_ATTENTION_CL
#define CLATTN_LINEAR_ATTENTION_CL

#ifndef CLATTN_COMMON_CL
#include "common.cl"
#endif
#ifndef CLATTN_MASK_CL
#include "mask.cl"
#endif

#ifndef ROWS
#define ROWS 4
#endif
#ifndef BM
#define BM 4
#endif
#ifndef FEATURE
#define FEATURE 0
#endif
#ifndef CAUSAL
#define CAUSAL 0
#endif
#ifndef HAS_STATE
#define HAS_STATE 0
#endif
#ifndef CLATTN_ROWS_CL
#include "rows.cl"
#endif

#define SLOT (HEAD_DIM * VALUE_DIM + HEAD_DIM)

/* The feature map. elu(x) + 1 is x + 1 above 0 and exp(x) below (exp(x) - 1 + 1, without the
 * cancellation). A NaN stays NaN under each map. */
inline float feature(float x) {
#if FEATURE == 0
    return x > 0.0f ? x + 1.0f : exp(x);
#elif FEATURE == 1
    return x <= 0.0f ? 0.0f : x;
#else
    return x;
#endif
}

/* The feature map on a vector of lanes (every lane computes exp, then the select). */
#if VEC > 1
inline floatV feature_lanes(floatV x) {
#if FEATURE == 0
    return select(exp(x), x + 1.0f, x > (floatV)0.0f);
#elif FEATURE == 1
    return select(x, (floatV)0.0f, x <= (floatV)0.0f);
#else
    return x;
#endif
}
#else
#define feature_lanes feature
#endif

/* Stores n (a multiple of VEC) floats of lane vectors to f32 scratch at `at`. ROW_LANES and
 * STORE_ROW_LANES: lane vector c of a float row, in any address space. */
#if VEC > 1
#define STORE_SCRATCH(p, at, n, in)                                                                \
    for (int c = 0; c < (n) / VEC; ++c) CAT(vstore, VEC)(in[c], 0, (p) + (at) + (IDX)(c * VEC))
#define ROW_LANES(row, c)              CAT(vload, VEC)(c, row)
#define STORE_ROW_LANES(row, c, value) CAT(vstore, VEC)(value, c, row)
#else
#define STORE_SCRATCH(p, at, n, in)                                                                \
    for (int c = 0; c < (n); ++c) (p)[(at) + (IDX)c] = in[c]
#define ROW_LANES(row, c)              (row)[c]
#define STORE_ROW_LANES(row, c, value) (row)[c] = (value)
#endif

/* The two key-side kernels take one argument list (linear_features ignores v, states and the
 * chunks). */
#define KEY_SIDE_PARAMS                                                                            \
    TENSOR_PARAMS(K_T, k), TENSOR_PARAMS(V_T, v), __global float *states, __global float *phik,    \
        IDX phik_off, int B, int H, int Sk, int chunk, int nchunks, MASK_PARAMS

__kernel void linear_features(KEY_SIDE_PARAMS) {
    const int item = (int)get_global_id(0);
    if (item >= B * H * Sk) return;
    const int j = item % Sk, bh = item / Sk, b = bh / H, h = bh % H;
    MASK_PACK(p);
    if (j >= mask_key_length(&p, b, Sk)) return;
    lane_t row[LANES(HEAD_DIM)];
    LOAD_ROW(K_T, k, AT(k, b, h, j, 0), k_s3, HEAD_DIM, row);
    for (int c = 0; c < LANES(HEAD_DIM); ++c) row[c] = feature_lanes(row[c]);
    STORE_SCRATCH(phik, phik_off + (IDX)item * HEAD_DIM, HEAD_DIM, row);
}

__kernel void linear_states(KEY_SIDE_PARAMS) {
    const int row_blocks = HEAD_DIM / ROWS;
    const int item = (int)get_global_id(0);
    if (item >= B * H * nchunks * row_blocks) return;
    const int d0 = (item % row_blocks) * ROWS, unit = item / row_blocks;
    const int part = unit % nchunks, bh = unit / nchunks, b = bh / H, h = bh % H;
    MASK_PACK(p);
    const int first = part * chunk, last = min(first + chunk, mask_key_length(&p, b, Sk));

    lane_t acc[ROWS][LANES(VALUE_DIM)];
    float z[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        z[r] = 0.0f;
        for (int c = 0; c < LANES(VALUE_DIM); ++c) acc[r][c] = (lane_t)0.0f;
    }
    for (int j = first; j < last; ++j) {
        float f[ROWS];
        for (int r = 0; r < ROWS; ++r)
            f[r] = phik[phik_off + ((IDX)bh * (IDX)Sk + (IDX)j) * HEAD_DIM + d0 + r];
        lane_t row[LANES(VALUE_DIM)];
        LOAD_ROW(V_T, v, AT(v, b, h, j, 0), v_s3, VALUE_DIM, row);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            z[r] += f[r];
#pragma unroll
            for (int c = 0; c < LANES(VALUE_DIM); ++c)
                acc[r][c] = fma((lane_t)f[r], row[c], acc[r][c]);
        }
    }
    __global float *slot = states + ((IDX)bh * (IDX)(nchunks + 1) + (IDX)(part + 1)) * SLOT;
    for (int r = 0; r < ROWS; ++r) {
        STORE_SCRATCH(slot, (IDX)(d0 + r) * VALUE_DIM, VALUE_DIM, acc[r]);
        slot[HEAD_DIM * VALUE_DIM + d0 + r] = z[r];
    }
}

/* Tiles (the host's TILES, for GPUs): the chunk states and the outputs as products of a group's
 * block, BR state rows (BQ queries) by BC value columns, whose operands are staged TS keys (or
 * head dims) a step in local memory; each work-item keeps a TR x TC tile of the block in
 * registers, so a float it reads from local memory feeds TC (or TR) FMAs, where linear_states
 * and linear_outputs read a value row from global memory for every state row or query. Every
 * accumulator sums in the order of the row kernels (keys, then head dims, ascending): the states
 * and the non-causal outputs come out the same bits. Blocks past a head dim are padded with zeros
 * in local memory and not stored. A group has (BR / TR) x (BC / TC) work-items (the outputs'
 * (BQ / TR) x (BC / TC)), as the host launches it. */
#ifndef TR
#define TR 8
#endif
#ifndef TC
#define TC 8
#endif
#ifndef TS
#define TS 16
#endif
#ifndef BR
#define BR 64
#endif
#ifndef BC
#define BC 64
#endif
#ifndef BQ
#define BQ BR
#endif
#ifndef MAP_KEYS
#define MAP_KEYS 0
#endif
#define TILE_ITEMS ((BR / TR) * (BC / TC))   /* linear_states_tiles' group */
#define OUTPUT_ITEMS ((BQ / TR) * (BC / TC)) /* linear_outputs_tiles' */

/* The TR x TC tile of the work-item `lid`: its first row and column in the block. */
#define TILE_ROW(lid) ((lid) / (BC / TC) * TR)
#define TILE_COL(lid) ((lid) % (BC / TC) * TC)

/* The tiles' local arrays are of lane vectors (so aligned for them: TS is a multiple of VEC)
 * and read as floats: lane vector c of a row (written by LANE_STORE; a row that starts on a
 * lane vector), and a work-item's TR floats of a row, as float4s where TR and the alignment
 * allow (clang's PTX made four 4-byte loads of a vload4 from local memory, whose alignment it
 * cannot know). */
#define LANE_AT(p, c)       (((__local const lane_t *)(p))[c])
#define LANE_STORE(p, c, x) (((__local lane_t *)(p))[c] = (x))
#if TR % 4 == 0 && VEC >= 4
#define TILE_FLOATS(f, p)                                                                          \
    UNROLL for (int q4 = 0; q4 < TR / 4; ++q4) vstore4(((__local const float4 *)(p))[q4], q4, f)
#else
#define TILE_FLOATS(f, p) UNROLL for (int q4 = 0; q4 < TR; ++q4)(f)[q4] = (p)[q4]
#endif

/* The lane vector of phi(k_j) from head dim d on, kv head (b, h) (bh: its index over B x Hkv):
 * with MAP_KEYS, the map of k's lane vector (the same map of the same lanes as
 * linear_features', so the same bits, and neither phi(k)'s bytes nor their launch); without,
 * what linear_features wrote (the host's MAP_KEYS: where a block of state rows is whole lane
 * vectors). */
inline lane_t key_features(TENSOR_PARAMS(K_T, k), __global const float *phik, IDX phik_off,
                           int b, int h, int bh, int Sk, int j, int d) {
#if MAP_KEYS
    return feature_lanes(LOAD_LANES(K_T, k, AT(k, b, h, j, d), k_s3));
#else
    return LOAD_LANES(f32, phik, phik_off + ((IDX)bh * (IDX)Sk + (IDX)j) * HEAD_DIM + (IDX)d, 1);
#endif
}

/* One step of a work-item's tile: acc += f row^T, row its TC floats of the local row `right`. */
inline void tile_product(lane_t acc[TR][TC / VEC], const float f[TR], __local const float *right) {
    lane_t row[TC / VEC];
    UNROLL for (int c = 0; c < TC / VEC; ++c) row[c] = LANE_AT(right, c);
    UNROLL for (int r = 0; r < TR; ++r) UNROLL for (int c = 0; c < TC / VEC; ++c)
        acc[r][c] = fma((lane_t)f[r], row[c], acc[r][c]);
}

__kernel void linear_states_tiles(KEY_SIDE_PARAMS) {
    __local lane_t keys_lanes[TS * BR / VEC], values_lanes[TS * BC / VEC];
    __local float *keys = (__local float *)keys_lanes, *values = (__local float *)values_lanes;
    const int lid = (int)get_local_id(0), row_blocks = (HEAD_DIM + BR - 1) / BR;
    const int col_blocks = (VALUE_DIM + BC - 1) / BC;
    const int group = (int)get_group_id(0), cb = group % col_blocks;
    const int rb = group / col_blocks % row_blocks, unit = group / col_blocks / row_blocks;
    const int part = unit % nchunks, bh = unit / nchunks, b = bh / H, h = bh % H;
    MASK_PACK(p);
    const int first = part * chunk, last = min(first + chunk, mask_key_length(&p, b, Sk));
    const int d0 = rb * BR, c0 = cb * BC, tr = TILE_ROW(lid), tc = TILE_COL(lid);

    lane_t acc[TR][TC / VEC];
    float z[TR];
    UNROLL for (int r = 0; r < TR; ++r) {
        z[r] = 0.0f;
        UNROLL for (int c = 0; c < TC / VEC; ++c) acc[r][c] = (lane_t)0.0f;
    }
    for (int j0 = first; j0 < last; j0 += TS) {
        const int n = min(TS, last - j0);
        barrier(CLK_LOCAL_MEM_FENCE);
#if MAP_KEYS
        for (int e = lid; e < n * (BR / VEC); e += TILE_ITEMS) {
            const int jj = e / (BR / VEC), c = e % (BR / VEC), d = d0 + c * VEC;
            lane_t x = (lane_t)0.0f;
            if (d < HEAD_DIM)
                x = key_features(k, k_off, k_s0, k_s1, k_s2, k_s3, phik, phik_off, b, h, bh, Sk,
                                 j0 + jj, d);
            LANE_STORE(keys + jj * BR, c, x);
        }
#else
        for (int e = lid; e < n * BR; e += TILE_ITEMS) {
            const int jj = e / BR, d = d0 + e % BR;
            keys[e] = d < HEAD_DIM
                          ? phik[phik_off + ((IDX)bh * (IDX)Sk + (IDX)(j0 + jj)) * HEAD_DIM + d]
                          : 0.0f;
        }
#endif
        for (int e = lid; e < n * (BC / VEC); e += TILE_ITEMS) {
            const int jj = e / (BC / VEC), c = e % (BC / VEC), col = c0 + c * VEC;
            lane_t x = (lane_t)0.0f;
            if (col < VALUE_DIM) x = LOAD_LANES(V_T, v, AT(v, b, h, j0 + jj, col), v_s3);
            LANE_STORE(values + jj * BC, c, x);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int jj = 0; jj < n; ++jj) {
            float f[TR];
            TILE_FLOATS(f, keys + jj * BR + tr);
            tile_product(acc, f, values + jj * BC + tc);
            UNROLL for (int r = 0; r < TR; ++r) z[r] += f[r];
        }
    }
    __global float *slot = states + ((IDX)bh * (IDX)(nchunks + 1) + (IDX)(part + 1)) * SLOT;
    UNROLL for (int r = 0; r < TR; ++r) {
        const int d = d0 + tr + r;
        if (d >= HEAD_DIM) break;
        UNROLL for (int c = 0; c < TC / VEC; ++c) {
            const int col = c0 + tc + c * VEC;
            if (col < VALUE_DIM)
                STORE_ROW_LANES(slot + (IDX)d * VALUE_DIM + (IDX)col, 0, acc[r][c]);
        }
        if (c0 + tc == 0) slot[HEAD_DIM * VALUE_DIM + d] = z[r];
    }
}

#if HAS_STATE
#define STATE_PARAMS                                                                               \
    , __global float *s, IDX s_off, IDX s_s0, IDX s_s1, IDX s_s2, IDX s_s3, __global float *z,     \
        IDX z_off, IDX z_s1, IDX z_s2, IDX z_s3, int H
#else
#define STATE_PARAMS
#endif

/* One work-item per VEC lanes of a state row (and, the first of a row, its z): the running
 * sums over the slots, in vectors (an element per work-item ran the decoding step's scan at
 * a fifth of the copy speed on PoCL). */
__kernel void linear_scan(__global float *states, int BH, int nchunks STATE_PARAMS) {
    const int item = (int)get_global_id(0);
    if (item >= BH * HEAD_DIM * LANES(VALUE_DIM)) return;
    const int c = item % LANES(VALUE_DIM), row = item / LANES(VALUE_DIM);
    const int d = row % HEAD_DIM, bh = row / HEAD_DIM;
    IDX at = (IDX)bh * (IDX)(nchunks + 1) * SLOT + (IDX)d * VALUE_DIM + (IDX)(c * VEC);
    IDX z_at = (IDX)bh * (IDX)(nchunks + 1) * SLOT + HEAD_DIM * VALUE_DIM + (IDX)d;
    lane_t run[1] = {(lane_t)0.0f};
    float z_run = 0.0f;
#if HAS_STATE
    /* the caller's S[b, h, d, c*VEC ...] and z[b, h, d] */
    const int b = bh / H, h = bh % H;
    const IDX own_at =
        s_off + (IDX)b * s_s0 + (IDX)h * s_s1 + (IDX)d * s_s2 + (IDX)(c * VEC) * s_s3;
    const IDX own_z = z_off + (IDX)b * z_s1 + (IDX)h * z_s2 + (IDX)d * z_s3;
    LOAD_ROW(f32, s, own_at, s_s3, VEC, run);
    if (c == 0) z_run = z[own_z]; /* the row's first work-item owns z (the others never read it) */
#endif
    /* causal outputs read every running sum; non-causal ones (and their gradients) only the
     * total, slot nchunks, so the others are not stored (a third of the scan's traffic) */
    if (CAUSAL || nchunks == 0) {
        STORE_SCRATCH(states, at, VEC, run);
        if (c == 0) states[z_at] = z_run;
    }
    for (int slot = 1; slot <= nchunks; ++slot) {
        at += SLOT, z_at += SLOT;
        lane_t part[1];
        LOAD_ROW(f32, states, at, 1, VEC, part);
        run[0] += part[0];
        if (c == 0) z_run += states[z_at];
        if (!CAUSAL && slot < nchunks) continue;
        STORE_SCRATCH(states, at, VEC, run);
        if (c == 0) states[z_at] = z_run;
    }
#if HAS_STATE
    for (int e = 0; e < VEC; ++e) s[own_at + (IDX)e * s_s3] = ((float *)run)[e];
    if (c == 0) z[own_z] = z_run;
#endif
}

/* The two outputs kernels take one argument list (linear_outputs ignores k, the tiles phik where
 * they map k themselves). */
#define OUTPUT_SIDE_PARAMS                                                                         \
    TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(K_T, k), TENSOR_PARAMS(V_T, v),                           \
        __global CAT(storage_, O_T) * o, IDX o_off, IDX o_s0, IDX o_s1, IDX o_s2, IDX o_s3,        \
        __global const float *states, __global const float *phik, IDX phik_off, int B, int Hq,     \
        int Hkv, int Sq, int Sk, int chunk, int nchunks, float eps, MASK_PARAMS

__kernel void linear_outputs(OUTPUT_SIDE_PARAMS) {
    const int blocks = (Sq + BM - 1) / BM;
    const int item = (int)get_global_id(0);
    if (item >= B * Hq * blocks) return;
    const int i0 = (item % blocks) * BM, bh = item / blocks, h = bh % Hq, b = bh / Hq;
    const int bhk = b * Hkv + h / (Hq / Hkv);
    MASK_PACK(p);

    /* each query's end, and the smallest and largest of those that see any key */
    int end[BM], lo = Sk, hi = 0;
#pragma unroll
    for (int r = 0; r < BM; ++r) {
        end[r] = i0 + r < Sq ? mask_row_start(&p, b, h, i0 + r, Sq, Sk).end : 0;
        if (end[r] > 0) lo = min(lo, end[r]), hi = max(hi, end[r]);
    }
    float fq[BM][HEAD_DIM];
#pragma unroll
    for (int r = 0; r < BM; ++r) {
        lane_t row[LANES(HEAD_DIM)];
#pragma unroll
        for (int c = 0; c < LANES(HEAD_DIM); ++c) row[c] = (lane_t)0.0f;
        if (end[r] > 0) LOAD_ROW(Q_T, q, AT(q, b, h, i0 + r, 0), q_s3, HEAD_DIM, row);
#pragma unroll
        for (int c = 0; c < LANES(HEAD_DIM); ++c) STORE_ROW_LANES(fq[r], c, feature_lanes(row[c]));
    }

    /* the state of the whole chunks before the block's first visible key past them */
    const int whole = CAUSAL ? lo / chunk : nchunks;
    __global const float *state = states + ((IDX)bhk * (IDX)(nchunks + 1) + (IDX)whole) * SLOT;
    lane_t acc[BM][LANES(VALUE_DIM)];
    float den[BM];
#pragma unroll
    for (int r = 0; r < BM; ++r) {
        den[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < LANES(VALUE_DIM); ++c) acc[r][c] = (lane_t)0.0f;
    }
    for (int d = 0; d < HEAD_DIM; ++d) {
        lane_t row[LANES(VALUE_DIM)];
        LOAD_ROW(f32, state, (IDX)d * VALUE_DIM, 1, VALUE_DIM, row);
        const float zd = state[HEAD_DIM * VALUE_DIM + d];
#pragma unroll
        for (int r = 0; r < BM; ++r) {
            den[r] = fma(fq[r][d], zd, den[r]);
#pragma unroll
            for (int c = 0; c < LANES(VALUE_DIM); ++c)
                acc[r][c] = fma((lane_t)fq[r][d], row[c], acc[r][c]);
        }
    }
#if CAUSAL
    /* the keys from there on, each query up to its own end */
    for (int j = whole * chunk; j < hi; ++j) {
        lane_t key[LANES(HEAD_DIM)], value[LANES(VALUE_DIM)];
        LOAD_ROW(f32, phik, phik_off + ((IDX)bhk * (IDX)Sk + (IDX)j) * HEAD_DIM, 1, HEAD_DIM, key);
        LOAD_ROW(V_T, v, AT(v, b, bhk % Hkv, j, 0), v_s3, VALUE_DIM, value);
#pragma unroll
        for (int r = 0; r < BM; ++r) {
            if (j >= end[r]) continue;
            lane_t dot = (lane_t)0.0f;
#pragma unroll
            for (int c = 0; c < LANES(HEAD_DIM); ++c)
                dot = fma(ROW_LANES(fq[r], c), key[c], dot);
            const float weight = DOT_FINISH(dot);
            den[r] += weight;
#pragma unroll
            for (int c = 0; c < LANES(VALUE_DIM); ++c)
                acc[r][c] = fma((lane_t)weight, value[c], acc[r][c]);
        }
    }
#endif
#pragma unroll
    for (int r = 0; r < BM && i0 + r < Sq; ++r) {
        const int i = i0 + r;
        const lane_t denominator = (lane_t)(den[r] + eps);
#pragma unroll
        for (int c = 0; c < LANES(VALUE_DIM); ++c) {
            lane_t value = end[r] > 0 ? acc[r][c] / denominator : (lane_t)0.0f;
            STORE_LANES(i, c, value)
        }
    }
}

/* Tiles (above) of the outputs: a group's BQ queries by BC value columns. First phi(q) S over
 * the head dims, TS a step: S the total state (not CAUSAL) or the state of the whole chunks
 * before the block's smallest end (CAUSAL), its rows staged beside phi(q). Not CAUSAL, phi(q) is
 * staged a step at a time, transposed (a work-item reads its TR queries of a head dim side by
 * side); CAUSAL, the block's phi(q) rows are staged whole at the start (QS floats apart: rows a
 * lane vector longer fall in other banks), since the keys after those chunks need them whole:
 * TS keys a step, the group forms the weights phi(q_i) phi(k_j) of the block's queries (each as
 * linear_outputs forms it), then each work-item adds its queries' weighted value rows, each query
 * up to its own end, in the order linear_outputs adds them. */
#define QS (HEAD_DIM + VEC)
#define WS (TS + 1) /* the weights' row stride (likewise) */

/* phi of the lane vector of q's row i from head dim d on (of zeros past Sq; a query past its
 * query length is read, and its output not stored) */
inline lane_t query_features(TENSOR_PARAMS(Q_T, q), int b, int h, int i, int Sq, int d) {
    lane_t x = (lane_t)0.0f;
    if (i < Sq) x = LOAD_LANES(Q_T, q, AT(q, b, h, i, d), q_s3);
    return feature_lanes(x);
}

#if CAUSAL
/* The weights of the block's queries against keys j0 .. j0 + n - 1 (staged in `keys`) into
 * `weights`, 0 for a key at or past the query's end: a lane-vector dot product over the head
 * dims, as linear_outputs takes it. */
inline void block_weights(__local const float *queries, __local const float *keys,
                          __local const int *ends, int j0, int n, __local float *weights) {
    for (int e = (int)get_local_id(0); e < BQ * n; e += OUTPUT_ITEMS) {
        const int qi = e / n, jj = e % n;
        lane_t dot = (lane_t)0.0f;
        if (j0 + jj < ends[qi])
            for (int c = 0; c < LANES(HEAD_DIM); ++c)
                dot = fma(LANE_AT(queries + qi * QS, c), LANE_AT(keys + jj * QS, c), dot);
        weights[qi * WS + jj] = DOT_FINISH(dot);
    }
}
#endif

__kernel void linear_outputs_tiles(OUTPUT_SIDE_PARAMS) {
    __local lane_t rows_lanes[TS * BC / VEC];
    __local float *rows = (__local float *)rows_lanes;
    __local float sums[TS];
#if CAUSAL
    __local lane_t queries_lanes[BQ * QS / VEC], keys_lanes[TS * QS / VEC];
    __local float *keys = (__local float *)keys_lanes, weights[BQ * WS];
    __local int ends[BQ];
#else
    __local lane_t queries_lanes[TS * BQ / VEC];
#endif
    __local float *queries = (__local float *)queries_lanes;
    const int lid = (int)get_local_id(0), col_blocks = (VALUE_DIM + BC - 1) / BC;
    const int blocks = (Sq + BQ - 1) / BQ, group = (int)get_group_id(0);
    const int cb = group % col_blocks, qb = group / col_blocks % blocks;
    const int bh = group / col_blocks / blocks, h = bh % Hq, b = bh / Hq;
    const int bhk = b * Hkv + h / (Hq / Hkv);
    const int i0 = qb * BQ, c0 = cb * BC, tr = TILE_ROW(lid), tc = TILE_COL(lid);
    MASK_PACK(p);
#if CAUSAL
    for (int e = lid; e < BQ; e += OUTPUT_ITEMS)
        ends[e] = i0 + e < Sq ? mask_row_start(&p, b, h, i0 + e, Sq, Sk).end : 0;
    for (int e = lid; e < BQ * LANES(HEAD_DIM); e += OUTPUT_ITEMS) {
        const int qi = e / LANES(HEAD_DIM), c = e % LANES(HEAD_DIM);
        LANE_STORE(queries + qi * QS, c,
                   query_features(q, q_off, q_s0, q_s1, q_s2, q_s3, b, h, i0 + qi, Sq, c * VEC));
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    int lo = Sk, hi = 0; /* the smallest and largest of the ends that see any key */
    for (int e = 0; e < BQ; ++e)
        if (ends[e] > 0) lo = min(lo, ends[e]), hi = max(hi, ends[e]);
    int end[TR]; /* the work-item's queries' */
    UNROLL for (int r = 0; r < TR; ++r) end[r] = ends[tr + r];
    const int whole = lo / chunk;
#define TILE_ROW_END(r, i) end[r]
#else
    const int whole = nchunks;
#define TILE_ROW_END(r, i) mask_row_start(&p, b, h, i, Sq, Sk).end
#endif
    __global const float *state = states + ((IDX)bhk * (IDX)(nchunks + 1) + (IDX)whole) * SLOT;

    lane_t acc[TR][TC / VEC];
    float den[TR];
    UNROLL for (int r = 0; r < TR; ++r) {
        den[r] = 0.0f;
        UNROLL for (int c = 0; c < TC / VEC; ++c) acc[r][c] = (lane_t)0.0f;
    }
    for (int d0 = 0; d0 < HEAD_DIM; d0 += TS) {
        const int n = min(TS, HEAD_DIM - d0); /* both multiples of VEC */
        barrier(CLK_LOCAL_MEM_FENCE);
#if !CAUSAL
        for (int e = lid; e < BQ * (n / VEC); e += OUTPUT_ITEMS) {
            const int qi = e / (n / VEC), d = e % (n / VEC) * VEC;
            const lane_t x =
                query_features(q, q_off, q_s0, q_s1, q_s2, q_s3, b, h, i0 + qi, Sq, d0 + d);
            for (int l = 0; l < VEC; ++l) queries[(d + l) * BQ + qi] = ((float *)&x)[l];
        }
#endif
        for (int e = lid; e < n * (BC / VEC); e += OUTPUT_ITEMS) {
            const int dd = e / (BC / VEC), c = e % (BC / VEC) * VEC, col = c0 + c;
            lane_t x = (lane_t)0.0f;
            if (col < VALUE_DIM) x = LOAD_LANES(f32, state, (IDX)(d0 + dd) * VALUE_DIM + col, 1);
            LANE_STORE(rows + dd * BC, c / VEC, x);
        }
        for (int e = lid; e < n; e += OUTPUT_ITEMS) sums[e] = state[HEAD_DIM * VALUE_DIM + d0 + e];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int dd = 0; dd < n; ++dd) {
            float f[TR];
#if CAUSAL
            UNROLL for (int r = 0; r < TR; ++r) f[r] = queries[(tr + r) * QS + d0 + dd];
#else
            TILE_FLOATS(f, queries + dd * BQ + tr);
#endif
            tile_product(acc, f, rows + dd * BC + tc);
            UNROLL for (int r = 0; r < TR; ++r) den[r] = fma(f[r], sums[dd], den[r]);
        }
    }
#if CAUSAL
    /* the keys from there on (rows reused for their values) */
    const int hk = bhk % Hkv;
    for (int j0 = whole * chunk; j0 < hi; j0 += TS) {
        const int n = min(TS, hi - j0);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int e = lid; e < n * LANES(HEAD_DIM); e += OUTPUT_ITEMS) {
            const int jj = e / LANES(HEAD_DIM), c = e % LANES(HEAD_DIM);
            LANE_STORE(keys + jj * QS, c,
                       key_features(k, k_off, k_s0, k_s1, k_s2, k_s3, phik, phik_off, b, hk, bhk,
                                    Sk, j0 + jj, c * VEC));
        }
        for (int e = lid; e < n * (BC / VEC); e += OUTPUT_ITEMS) {
            const int jj = e / (BC / VEC), c = e % (BC / VEC) * VEC, col = c0 + c;
            lane_t x = (lane_t)0.0f;
            if (col < VALUE_DIM) x = LOAD_LANES(V_T, v, AT(v, b, hk, j0 + jj, col), v_s3);
            LANE_STORE(rows + jj * BC, c / VEC, x);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        block_weights(queries, keys, ends, j0, n, weights);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int jj = 0; jj < n; ++jj) {
            lane_t row[TC / VEC];
            UNROLL for (int c = 0; c < TC / VEC; ++c) row[c] = LANE_AT(rows + jj * BC + tc, c);
            UNROLL for (int r = 0; r < TR; ++r) {
                if (j0 + jj >= end[r]) continue;
                const float weight = weights[(tr + r) * WS + jj];
                den[r] += weight;
                UNROLL for (int c = 0; c < TC / VEC; ++c)
                    acc[r][c] = fma((lane_t)weight, row[c], acc[r][c]);
            }
        }
    }
#endif
    UNROLL for (int r = 0; r < TR; ++r) {
        const int i = i0 + tr + r;
        if (i >= Sq) break;
        const int row_end = TILE_ROW_END(r, i);
        const lane_t denominator = (lane_t)(den[r] + eps);
        UNROLL for (int c = 0; c < TC / VEC; ++c) {
            const int col = c0 + tc + c * VEC;
            if (col >= VALUE_DIM) break;
            lane_t value = row_end > 0 ? acc[r][c] / denominator : (lane_t)0.0f;
            STORE_LANES(i, col / VEC, value)
        }
    }
}

/* The recurrent step (the host's RECURRENT: a step, clattn_linear_attention_step, of at most
 * that many tokens): one kernel, a group per (batch, kv head), on the caller's state itself, no
 * scratch. The chunked form (four kernels, the state copied through scratch) spent most of a
 * decoding step launching them. The group stages phi(k) of the STEP_TOKENS tokens and phi(q) of
 * its STEP_HEADS query heads' tokens in local memory; forms each query's denominator from z and
 * the keys up to it, then adds the keys below the key length to z; then each work-item walks
 * value columns: for each head dim d, S[d][c] plus each token's phi(k)[d] v[c] in order, each
 * query's numerator from S as it stands after the query's own token (its end: the step's mask
 * is causal with the key and query lengths equal, so token t sees the state and tokens up to
 * t), and S[d][c] stored back. */
#if HAS_STATE && defined(STEP_TOKENS)
/* Lane vector x into the caller's f32 state at `at`, element stride `stride` (ALIGNED: the
 * host proved its rows start on lane vectors, stride 1). */
inline void store_state_lanes(__global float *s, IDX at, IDX stride, lane_t x) {
#if VEC > 1 && ALIGNED
    CAT(CAT(store_aligned, VEC), _f32)(s, at, x);
#else
    for (int l = 0; l < VEC; ++l) s[at + (IDX)l * stride] = ((float *)&x)[l];
#endif
}

/* a group's queries: head g's token t at g * STEP_TOKENS + t */
#define STEP_QUERIES (STEP_HEADS * STEP_TOKENS)

__kernel void linear_recurrence(TENSOR_PARAMS(Q_T, q), TENSOR_PARAMS(K_T, k),
                                TENSOR_PARAMS(V_T, v), __global CAT(storage_, O_T) * o,
                                IDX o_off, IDX o_s0, IDX o_s1, IDX o_s2, IDX o_s3 STATE_PARAMS,
                                float eps, MASK_PARAMS) {
    __local lane_t keys_lanes[STEP_TOKENS * LANES(HEAD_DIM)];
    __local lane_t queries_lanes[STEP_QUERIES * LANES(HEAD_DIM)];
    __local float *keys = (__local float *)keys_lanes, *queries = (__local float *)queries_lanes;
    __local float dens[STEP_QUERIES];
    const int lid = (int)get_local_id(0), items = (int)get_local_size(0);
    const int bh = (int)get_group_id(0), b = bh / H, hk = bh % H;
    MASK_PACK(p);
    const int keys_in = mask_key_length(&p, b, STEP_TOKENS); /* the step's keys in the state */
    for (int e = lid; e < STEP_TOKENS * LANES(HEAD_DIM); e += items) {
        const int t = e / LANES(HEAD_DIM), c = e % LANES(HEAD_DIM);
        LANE_STORE(keys + t * HEAD_DIM, c,
                   feature_lanes(LOAD_LANES(K_T, k, AT(k, b, hk, t, c * VEC), k_s3)));
    }
    for (int e = lid; e < STEP_QUERIES * LANES(HEAD_DIM); e += items) {
        const int qe = e / LANES(HEAD_DIM), c = e % LANES(HEAD_DIM);
        const int h = hk * STEP_HEADS + qe / STEP_TOKENS, t = qe % STEP_TOKENS;
        LANE_STORE(queries + qe * HEAD_DIM, c,
                   feature_lanes(LOAD_LANES(Q_T, q, AT(q, b, h, t, c * VEC), q_s3)));
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const IDX z_at = z_off + (IDX)b * z_s1 + (IDX)hk * z_s2;
    for (int e = lid; e < STEP_QUERIES; e += items) {
        const int t = e % STEP_TOKENS;
        float den = 0.0f;
        for (int d = 0; d < HEAD_DIM; ++d) {
            float zd = z[z_at + (IDX)d * z_s3];
            for (int j = 0; j <= t && j < keys_in; ++j) zd += keys[j * HEAD_DIM + d];
            den = fma(queries[e * HEAD_DIM + d], zd, den);
        }
        dens[e] = den;
    }
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE); /* every read of z is done */
    for (int d = lid; d < HEAD_DIM; d += items) {
        float zd = z[z_at + (IDX)d * z_s3];
        for (int j = 0; j < keys_in; ++j) zd += keys[j * HEAD_DIM + d];
        z[z_at + (IDX)d * z_s3] = zd;
    }
    for (int c = lid; c < LANES(VALUE_DIM); c += items) { /* lane vector c of the columns */
        lane_t value[STEP_TOKENS], num[STEP_QUERIES];
        UNROLL for (int t = 0; t < STEP_TOKENS; ++t) {
            value[t] = (lane_t)0.0f;
            if (t < keys_in) value[t] = LOAD_LANES(V_T, v, AT(v, b, hk, t, c * VEC), v_s3);
        }
        UNROLL for (int e = 0; e < STEP_QUERIES; ++e) num[e] = (lane_t)0.0f;
        IDX at = s_off + (IDX)b * s_s0 + (IDX)hk * s_s1 + (IDX)(c * VEC) * s_s3;
#pragma unroll 4 /* independent loads of S in flight (a GPU's latency) */
        for (int d = 0; d < HEAD_DIM; ++d) {
            const IDX row = at + (IDX)d * s_s2;
            lane_t sd = LOAD_LANES(f32, s, row, s_s3);
            UNROLL for (int t = 0; t < STEP_TOKENS; ++t) {
                if (t < keys_in) sd = fma((lane_t)keys[t * HEAD_DIM + d], value[t], sd);
                UNROLL for (int g = 0; g < STEP_HEADS; ++g) {
                    const int e = g * STEP_TOKENS + t;
                    num[e] = fma((lane_t)queries[e * HEAD_DIM + d], sd, num[e]);
                }
            }
            store_state_lanes(s, row, s_s3, sd);
        }
        UNROLL for (int qe = 0; qe < STEP_QUERIES; ++qe) {
            const int h = hk * STEP_HEADS + qe / STEP_TOKENS, i = qe % STEP_TOKENS;
            const bool sees = mask_row_start(&p, b, h, i, STEP_TOKENS, STEP_TOKENS).end > 0;
            const lane_t out = sees ? num[qe] / (lane_t)(dens[qe] + eps) : (lane_t)0.0f;
            STORE_LANES(i, c, out)
        }
    }
}
#endif

#endif /* CLATTN_LINEAR_ATTENTION_CL */
