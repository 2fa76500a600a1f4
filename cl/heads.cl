/*
 * Multi-head reshape: one strided 4-D copy kernel, with dtype conversion and an optional
 * broadcast bias add, and its transposing form (transpose4d, at the end). Split heads, merge
 * heads and packed-QKV split are all views fed to them (src/ops/heads.c builds the views and
 * picks the kernel).
 *
 * Build options (every one has a default, so this file compiles alone):
 *   SRC_T, DST_T   storage dtype tokens f32 | f16 | bf16
 *   COPY_RAW       1: same dtype and no bias; move raw bits (bit-exact, NaN payloads kept)
 *   HAS_BIAS       1: add a broadcast bias (BIAS_T) in f32 before the store
 *   CONTIG         1: the innermost stride is 1 in every tensor (the host coalesces dims first)
 *   VEC            elements per work-item along the innermost dim (2, 4, 8, 16)
 *   ALIGNED        1: every vector access of a CONTIG copy starts VEC-aligned (the host checks
 *                  offsets, outer strides and base alignment): vector-pointer accesses, so a
 *                  GPU moves a chunk in one instruction (common.cl's load_aligned)
 *   IDX            uint or ulong (see common.cl)
 *   PARTS          1, or 3: a packed QKV split, one launch for the three outputs (see copy4d)
 *   TILES          1: transposes by transpose_tiles (local memory, GPUs) as well, at the end
 *
 * Grid: dim 0 walks the innermost dim in runs of `run` elements (a kernel argument, a multiple of
 * VEC), dim 1 the second innermost dim (PARTS times over), dim 2 the two outer dims flattened.
 * No barriers.
 * The host picks `run` for the device:
 *   run == VEC   consecutive work-items touch consecutive VEC-wide chunks: a GPU coalesces them.
 *   run >= row   one work-item copies a whole row with VEC-wide loads: on a CPU (PoCL) the row
 *                loop is the inner loop, so it stays a stream of full-width vector moves, and
 *                far fewer work-items means far less work-group scheduling.
 */
#ifndef VEC /* (before common.cl, whose vector helpers are defined for it) */
#define VEC 4
#endif
#ifndef CLATTN_COMMON_CL
#include "common.cl"
#endif

#ifndef SRC_T
#define SRC_T f32
#endif
#ifndef DST_T
#define DST_T f32
#endif
#ifndef BIAS_T
#define BIAS_T f32
#endif
#ifndef COPY_RAW
#define COPY_RAW 0
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef CONTIG
#define CONTIG 1
#endif
#ifndef ALIGNED
#define ALIGNED 0
#endif
#ifndef TILES
#define TILES 0
#endif
#ifndef PARTS
#define PARTS 1
#endif

#if VEC == 1 /* one element per work-item: the vector paths are the scalar ones */
#undef CONTIG
#define CONTIG 0
#endif

#if COPY_RAW
#define SRC_STORAGE CAT(raw_, SRC_T)
#define DST_STORAGE CAT(raw_, DST_T)
#define VALUE_T SRC_STORAGE
#define LOAD1(p, i) ((p)[i])
#define STORE1(p, i, v) ((p)[i] = (v))
#if ALIGNED
#define LOADV(p, i) (*(__global const CAT(SRC_STORAGE, VEC) *)((p) + (i)))
#define STOREV(p, i, v) (*(__global CAT(DST_STORAGE, VEC) *)((p) + (i)) = (v))
#else
#define LOADV(p, i) CAT(vload, VEC)(0, (p) + (i))
#define STOREV(p, i, v) CAT(vstore, VEC)((v), 0, (p) + (i))
#endif
#else
#define SRC_STORAGE CAT(storage_, SRC_T)
#define DST_STORAGE CAT(storage_, DST_T)
#define VALUE_T float
#define LOAD1(p, i) CAT(load_, SRC_T)(p, i)
#define STORE1(p, i, v) CAT(store_, DST_T)(p, i, v)
#if ALIGNED
#define LOADV(p, i) CAT(CAT(load_aligned, VEC), CAT(_, SRC_T))(p, i)
#define STOREV(p, i, v) CAT(CAT(store_aligned, VEC), CAT(_, DST_T))(p, i, v)
#else
#define LOADV(p, i) CAT(CAT(load, VEC), CAT(_, SRC_T))(p, i)
#define STOREV(p, i, v) CAT(CAT(store, VEC), CAT(_, DST_T))(p, i, v)
#endif
#endif

#if HAS_BIAS
#define BIAS_STORAGE CAT(storage_, BIAS_T)
#define BIAS_ARGS , __global const BIAS_STORAGE *bias, IDX bias_off, IDX bs0, IDX bs1, IDX bs2, IDX bs3
#define BIAS1(i) CAT(load_, BIAS_T)(bias, i)
/* A bias that is constant along the innermost dim (stride 0) is loaded once per run. */
#define BIASV(i) (bs3 == 0 ? (floatV)BIAS1(i) : CAT(CAT(load, VEC), CAT(_, BIAS_T))(bias, i))
#else
#define BIAS_ARGS
#endif

/* PARTS == 3: parts 1 and 2 (k and v) go to dst1 and dst2, which share dst's strides, and read
 * src (and bias) part_step (bias_part_step) elements past the part before. */
#if PARTS == 3
#define PART_ARGS                                                                                 \
    , __global DST_STORAGE *dst1, IDX dst1_off, __global DST_STORAGE *dst2, IDX dst2_off,          \
        IDX part_step, IDX bias_part_step
#elif PARTS == 1
#define PART_ARGS
#else
#error "PARTS must be 1 or 3"
#endif

/* Grid dim 1 walks PARTS x n2 rows, the part outside. When plan dim 2 is the heads (the host
 * puts them there when S > 3H), the rows of one packed row's q, k and v are neighbours, and the
 * source is read in memory order. */
__kernel void copy4d(__global const SRC_STORAGE *src, IDX src_off, IDX ss0, IDX ss1, IDX ss2,
                     IDX ss3, __global DST_STORAGE *dst, IDX dst_off, IDX ds0, IDX ds1, IDX ds2,
                     IDX ds3, IDX n0, IDX n1, IDX n2, IDX n3, IDX run BIAS_ARGS PART_ARGS) {
    const IDX first = (IDX)get_global_id(0) * run;
    if (first >= n3) return;
    const IDX end = min(first + run, n3);
    /* Dims 1 and 2 loop over the grid, so the host can keep them within the 65535 work-groups
     * that some GPUs allow there; on most launches each loop runs once. */
    for (IDX i01 = (IDX)get_global_id(2); i01 < n0 * n1; i01 += (IDX)get_global_size(2))
        for (IDX row = (IDX)get_global_id(1); row < PARTS * n2; row += (IDX)get_global_size(1)) {
            const IDX i0 = i01 / n1;
            const IDX i1 = i01 - i0 * n1;
#if PARTS == 1
            const IDX i2 = row;
            __global DST_STORAGE *out = dst;
            IDX s = src_off, d = dst_off;
#else
            const IDX part = row / n2;
            const IDX i2 = row - part * n2;
            __global DST_STORAGE *out = part == 0 ? dst : part == 1 ? dst1 : dst2;
            IDX s = src_off + part * part_step;
            IDX d = part == 0 ? dst_off : part == 1 ? dst1_off : dst2_off;
#endif
            s += i0 * ss0 + i1 * ss1 + i2 * ss2 + first * ss3;
            d += i0 * ds0 + i1 * ds1 + i2 * ds2 + first * ds3;
#if HAS_BIAS
            IDX b = bias_off + i0 * bs0 + i1 * bs1 + i2 * bs2 + first * bs3;
#if PARTS == 3
            b += part * bias_part_step;
#endif
#endif
            IDX c = first;
#if CONTIG
            for (; c + VEC <= end; c += VEC, s += VEC, d += VEC) {
#if HAS_BIAS
                STOREV(out, d, LOADV(src, s) + BIASV(b));
                b += VEC * bs3;
#else
                STOREV(out, d, LOADV(src, s));
#endif
            }
#endif
            /* The tail of a run, or any strided innermost dim. */
            for (; c < end; ++c, s += ss3, d += ds3) {
                VALUE_T v = LOAD1(src, s);
#if HAS_BIAS
                v += BIAS1(b);
                b += bs3;
#endif
                STORE1(out, d, v);
            }
        }
}

/*
 * transpose4d: the same map without a bias, for a transposed view: the destination's
 * unit-stride dim (plan dim 3) is strided in the source, whose unit-stride dim is plan dim 2 (as
 * attention's backward makes of p and dS). copy4d would read such a source one element at a
 * time, a cache line and often a page per element (3.6 GB/s on PoCL). Here each work-item
 * moves a VEC x VEC block: VEC vector loads along the source's unit-stride dim, a transpose in
 * registers (through a private array, since OpenCL C has no subscripts on vectors; the indices
 * are constants once unrolled), VEC vector stores along the destination's. Blocks cut by the
 * edge of either dim move element by element.
 *
 * Grid: dim 0 the blocks along dim 3, dim 1 the blocks along dim 2, dim 2 the two outer dims
 * flattened; dims 1 and 2 loop past the grid as copy4d's do. The host sends only views with
 * ss2 == 1 and ds3 == 1, which the vector accesses assume, and builds it only without a bias and
 * with VEC at most 8 (a larger block is more registers than it pays for).
 */
#if !HAS_BIAS && VEC <= 8
#define VSTORE CAT(vstore, VEC)
#define VLOAD  CAT(vload, VEC)

__kernel void transpose4d(__global const SRC_STORAGE *src, IDX src_off, IDX ss0, IDX ss1, IDX ss2,
                          IDX ss3, __global DST_STORAGE *dst, IDX dst_off, IDX ds0, IDX ds1,
                          IDX ds2, IDX ds3, IDX n0, IDX n1, IDX n2, IDX n3) {
    const IDX b0 = (IDX)get_global_id(0) * VEC; /* this work-item's block along dim 3 */
    if (b0 >= n3) return;
    const IDX nb = min((IDX)VEC, n3 - b0);
    for (IDX i01 = (IDX)get_global_id(2); i01 < n0 * n1; i01 += (IDX)get_global_size(2))
        for (IDX a0 = (IDX)get_global_id(1) * VEC; a0 < n2; a0 += (IDX)get_global_size(1) * VEC) {
            const IDX i0 = i01 / n1;
            const IDX i1 = i01 - i0 * n1;
            const IDX s = src_off + i0 * ss0 + i1 * ss1 + a0 * ss2 + b0 * ss3;
            const IDX d = dst_off + i0 * ds0 + i1 * ds1 + a0 * ds2 + b0 * ds3;
            const IDX na = min((IDX)VEC, n2 - a0);
            if (na == VEC && nb == VEC) {
                VALUE_T block[VEC][VEC]; /* block[r]: VEC elements along dim 2, dim 3 offset r */
                UNROLL for (int r = 0; r < VEC; ++r)
                    VSTORE(LOADV(src, s + (IDX)r * ss3), 0, block[r]);
                UNROLL for (int c = 0; c < VEC; ++c) {
                    VALUE_T column[VEC];
                    UNROLL for (int r = 0; r < VEC; ++r) column[r] = block[r][c];
                    STOREV(dst, d + (IDX)c * ds2, VLOAD(0, column));
                }
            } else {
                for (IDX c = 0; c < na; ++c)
                    for (IDX r = 0; r < nb; ++r)
                        STORE1(dst, d + c * ds2 + r * ds3, LOAD1(src, s + c * ss2 + r * ss3));
            }
        }
}
#endif

/*
 * transpose_tiles: transpose4d's map for a GPU (the copy row's TILES=1). A group of TILE x
 * TILE_ROWS work-items moves TILE x TILE tiles through local memory: it reads a tile along the
 * source's unit-stride dim (plan dim 2) and writes it along the destination's (plan dim 3), so
 * consecutive work-items touch consecutive elements on both sides. transpose4d's blocks read
 * VEC rows a work-item, each row VEC elements, the group's rows strided across memory: 43% of
 * the copy bandwidth in f32 and 14% in f16 on an H200. Each tile row is padded by one element,
 * so the second phase's column reads fall in distinct banks.
 *
 * Grid: groups of TILE x TILE_ROWS x 1; dim 0 the tiles along dim 3, dim 1 those along dim 2,
 * dim 2 the two outer dims flattened; dims 1 and 2 loop past the grid as copy4d's do (the loops'
 * bounds are the group's, so every work-item meets every barrier). The host sends only views
 * with ss2 == 1 and ds3 == 1, without a bias.
 */
#if TILES && !HAS_BIAS && PARTS == 1
#define TILE      32 /* (and src/ops/heads.c's enqueue_tiles) */
#define TILE_ROWS 8

__kernel __attribute__((reqd_work_group_size(TILE, TILE_ROWS, 1))) void
transpose_tiles(__global const SRC_STORAGE *src, IDX src_off, IDX ss0, IDX ss1, IDX ss2, IDX ss3,
                __global DST_STORAGE *dst, IDX dst_off, IDX ds0, IDX ds1, IDX ds2, IDX ds3, IDX n0,
                IDX n1, IDX n2, IDX n3) {
    __local VALUE_T tile[TILE][TILE + 1]; /* tile[along dim 3][along dim 2] */
    const int x = (int)get_local_id(0), y = (int)get_local_id(1);
    const IDX b0 = (IDX)get_group_id(0) * TILE; /* the tile's first element along dim 3 */
    for (IDX i01 = (IDX)get_group_id(2); i01 < n0 * n1; i01 += (IDX)get_num_groups(2))
        for (IDX a0 = (IDX)get_group_id(1) * TILE; a0 < n2; a0 += (IDX)get_num_groups(1) * TILE) {
            const IDX i0 = i01 / n1;
            const IDX i1 = i01 - i0 * n1;
            const IDX s = src_off + i0 * ss0 + i1 * ss1, d = dst_off + i0 * ds0 + i1 * ds1;
            /* read along dim 2: work-item x takes element a0 + x of rows b0 + y + k */
            for (int k = 0; k < TILE; k += TILE_ROWS) {
                const IDX a = a0 + (IDX)x, b = b0 + (IDX)(y + k);
                if (a < n2 && b < n3) tile[y + k][x] = LOAD1(src, s + a * ss2 + b * ss3);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            /* write along dim 3: work-item x takes element b0 + x of rows a0 + y + k */
            for (int k = 0; k < TILE; k += TILE_ROWS) {
                const IDX a = a0 + (IDX)(y + k), b = b0 + (IDX)x;
                if (a < n2 && b < n3) STORE1(dst, d + a * ds2 + b * ds3, tile[x][y + k]);
            }
            barrier(CLK_LOCAL_MEM_FENCE); /* the tile is read before the next one is written */
        }
}
#endif
