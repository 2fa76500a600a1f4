/*
 * Every op's tuning parameters, one line each:
 *
 *   X(NAME, DEFAULT, MIN, MAX, MACRO)
 *
 *   NAME     what CLATTN_TUNE, clattn_tuning_override, the table's rows and the op's code
 *            (t.NAME) call it
 *   DEFAULT  the op's "default" row: what a device with no row of its own runs
 *   MIN/MAX  the range an override or a row must lie in
 *   MACRO    the kernel macro the value is built with (-DMACRO=value, by the op's
 *            clattn__<op>_tuning_options), or HOST when only the host uses it
 *
 * tuning.h makes a struct per op from these (clattn__attention_tuning: long PREFILL, ...), the
 * lookup's and the parser's tables, and the build-option fragment. Rows for devices are in
 * tuning_table.def. Not installed.
 */
#ifndef CLATTN_RUNTIME_TUNING_PARAMS_H
#define CLATTN_RUNTIME_TUNING_PARAMS_H

/* Copies (split/merge heads, packed QKV, clattn_copy). VEC: elements per vector access (2, 4,
 * 8, 16); RUN: elements one work-item copies along the innermost dim; GROUP: group size. TILES:
 * transposed views by transpose_tiles (1: groups of 32 x 8 move 32 x 32 tiles through local
 * memory, coalesced on both sides; where the kernel's groups cannot hold 256, as 0) or by
 * transpose4d (0: a VEC x VEC register block a work-item).
 * Default: PoCL on AVX-512: a whole row per work-item (up to 4096 elements) in 16-element
 * vectors (64 bytes, a cache line) reached the copy kernel's bandwidth where a chunk per
 * work-item stayed at 25-45% of it (clattn-bench --op split_heads). */
#define CLATTN__TUNING_COPY(X)                                                                     \
    X(VEC, 16, 2, 16, VEC)                                                                         \
    X(RUN, 4096, 1, 1 << 20, HOST)                                                                 \
    X(GROUP, 64, 1, 1024, HOST)                                                                    \
    X(TILES, 0, 0, 1, TILES)

/* Softmax. VARIANT 0: softmax_rows (a work-item per row, VEC-wide vectors, GROUP rows a group,
 * SCRATCH floats of local memory per row keep the exponentials; HOLD unused); 1: softmax_group
 * (a group of GROUP per row, local tree reductions; VEC keys a chunk on aligned rows, else one
 * key a step; SCRATCH unused). HOLD: on aligned rows of at most GROUP * HOLD chunks each
 * work-item of softmax_group keeps its chunks in registers (HOLD * VEC floats), one read of the
 * row and one exponential a key instead of three reads and two; 0: always three passes.
 * HALF_CVT: f16 outputs by the device's conversion (1; full-profile devices only, whose default
 * rounding is to nearest even) or rounded in integer lanes (0): the same bits (cl/common.cl).
 * Default: PoCL on AVX-512 (2 cores): VEC 16 reached 43% of the copy bandwidth on an unmasked
 * 2048-key row against 27% at 8 (clattn-bench --op softmax), HALF_CVT 0 ran f16 rows 1.2-1.4x
 * faster than 1. HOLD 8: a GPU's 128 work-items of float4 hold rows up to 4096 keys in 32
 * registers each (on an H200, 2048-key rows: f32 0.33 ms against 0.40 without). */
#define CLATTN__TUNING_SOFTMAX(X)                                                                  \
    X(VARIANT, 0, 0, 1, HOST)                                                                      \
    X(VEC, 16, 1, 16, VEC)                                                                         \
    X(GROUP, 16, 1, 1024, GROUP)                                                                   \
    X(SCRATCH, 4096, 0, 65536, SCRATCH)                                                            \
    X(HOLD, 8, 0, 16, HOST)                                                                        \
    X(HALF_CVT, 0, 0, 1, HALF_CVT)

/* Fused attention. PREFILL: the variant for Sq > 8, DECODE: for Sq <= 8 (0 attention_blocks, BM
 * queries a work-item against BN-key tiles; 1 attention_tiles, a query a work-item, groups sharing
 * TK-key K/V tiles in local memory; 2 attention_keys, a group of 128 per query row; 3
 * attention_lanes, BM queries a work-item against tiles of LANES keys along the vector lanes, K
 * packed d-major in the workspace; 4 attention_micro, an MQ x MK tile of scores a work-item, TK /
 * MK work-items along a TK-key tile; 5, prefill only, attention_mma, NVIDIA's matrix-unit
 * products for f16/bf16 q, k, v: the instruction where clattn_matrix_units found it, else its
 * local-memory emulation, correct and slow; 6, prefill only, attention_units, the same on the
 * subgroup tile of whichever mechanism the probes found (AMD's, Intel's; without one, NVIDIA's
 * emulated); other dtypes and head dims take 1); LANES: head-dim vector width
 * (lanes: the keys a tile, blocks when under 4); LANE_TILES: lanes' key tiles a step, and the
 * backward queries pass's (each q element it broadcasts feeds that many FMAs, and a row rescales
 * once a step; a step past the keys re-reads its first tile for the rest: 2 on PoCL, B=4 H=8
 * S=1024 f32 D=64 and D=128 8-15% faster than 1, 4 a little faster again at D=64 and not at
 * D=128; the queries pass about 10%); GROUP: blocks', tiles' and
 * micro's group size (micro: at most); TK: the largest key tile (halved to fit); SPLIT_TARGET,
 * SPLIT_MIN: a launch with fewer groups than SPLIT_TARGET per compute unit splits the keys into
 * chunks of at least SPLIT_MIN; BM, BN: the blocks' queries per work-item and keys per tile; MQ,
 * MK: micro's queries and keys per work-item; UNITS 1: prefill with f16 or bf16 q, k, v takes
 * attention_mma (NVIDIA's unit) or attention_units (another's) wherever clattn_matrix_units found a
 * unit for their dtype, whatever PREFILL says (0: only PREFILL=5 or 6); UNIT_F32 1: so does f32
 * prefill, on attention_mma's 3xTF32 products, where the probes found NVIDIA's tf32 unit (about
 * f32's accuracy, as PyTorch's f32 SDPA on those GPUs; 0: f32 stays on the FMA units); UNIT_KEYS:
 * attention_mma's and attention_units' keys a tile (rounded down to a multiple of 16, then lowered
 * by 16 until its tiles fit the local memory); UNIT_QUERIES: attention_mma's queries a warp (16 or
 * 32, rounded down; 32 reads each K and V fragment once for two m-tiles of products, the same bits;
 * 16 where 32 do not fit the local memory with UNIT_KEYS, as at D=128 in 48 KiB; attention_units
 * takes 16 a subgroup); UNIT_AHEAD: attention_mma and attention_units fetch the next key tile
 * into registers while they compute one when the head dims (D + Dv) exceed UNIT_AHEAD, else at
 * the tile (0: always ahead; the registers it holds can cost a work-group a multiprocessor);
 * UNIT_ASYNC 1: attention_mma double-buffers its key tiles in local memory and copies the next
 * one there during this one (cp.async on NVIDIA's units: no register holds it; UNIT_AHEAD then
 * has no part), where the two tiles fit the local memory beside the rest; UNIT_SPLIT: attention_mma
 * splits the keys into chunks of UNIT_SPLIT (rounded up to whole key tiles), a group each, merged
 * after (0: no split; a causal launch's longest rows, which see every key, set its time), only
 * in a launch of fewer groups than SPLIT_TARGET a compute unit and in at most as many chunks as
 * make up for that, which bounds the partials (B * Hq * Sq * splits * (Dv + 2) floats of
 * workspace, rows that see none of a chunk included); LPT 1: under a causal mask, the variants
 * that launch a group per query block (tiles, micro, mma, units, and the backward's queries
 * tiles) start the longest groups first (a head's last block sees the most keys; 0: a head's
 * blocks in turn, as without a mask), a section of heads at a time, so that on a device that gives
 * each compute unit the next group as one ends (a GPU: the type:gpu rows) the launch's tail is its
 * lightest groups (on PoCL, whose threads seem to take contiguous ranges of groups, the heavy
 * blocks went to one thread: 1.5x slower); LPT_MB: the cache a section's keys and values fill, in
 * MiB (0: the device's CL_DEVICE_GLOBAL_MEM_CACHE_SIZE), at least a wave's groups
 * (src/ops/attention.c, clattn__attention_order). The backward (clattn_attention_backward) reads
 * this row too: LANES, BM, GROUP, SPLIT_TARGET and SPLIT_MIN size its lanes kernels (CPUs);
 * BWD_TILES 1 takes its tiles kernels instead (GPUs: cl/attention_backward.cl, Tiles), groups of
 * BWD_GROUP work-items (fewer where the device or the kernel takes fewer), each holding a key's or
 * a query's head dims in slices of at most BWD_SLICE (the fewest slices that divide both head dims
 * and allow it, else their greatest common divisor), the other side staged BWD_BLOCK rows at a time
 * (halved until the local memory holds it); SPLIT_TARGET and SPLIT_MIN split the queries pass's
 * keys and the keys pass's query rows in either family, a row split keeping at least
 * BWD_SPLIT_MIN rows (0: SPLIT_MIN); a lanes keys work-item takes BWD_KEY_TILES tiles of LANES
 * keys (one where dbias is asked), so that each q and dO element it loads feeds that many (2 on
 * PoCL: its keys pass 51 ms against 69 at B=4 H=8 S=1024 D=64; 4 was slower). Default: PoCL on
 * AVX-512: blocks at 16 lanes (the tiles variant's one query per work-item ran far slower there),
 * clattn-bench --op attention_causal. */
#define CLATTN__TUNING_ATTENTION(X)                                                                \
    X(PREFILL, 0, 0, 6, HOST)                                                                      \
    X(DECODE, 0, 0, 4, HOST)                                                                       \
    X(LANES, 16, 1, 16, VEC)                                                                       \
    X(GROUP, 16, 1, 1024, HOST)                                                                    \
    X(TK, 32, 1, 32, TK)                                                                           \
    X(SPLIT_TARGET, 8, 1, 1024, HOST)                                                              \
    X(SPLIT_MIN, 128, 32, 1 << 20, HOST)                                                           \
    X(BM, 4, 1, 8, BM)                                                                             \
    X(BN, 16, 4, 32, BN)                                                                           \
    X(MQ, 4, 1, 8, MQ)                                                                             \
    X(MK, 2, 1, 8, MK)                                                                             \
    X(UNITS, 1, 0, 1, HOST)                                                                        \
    X(UNIT_F32, 1, 0, 1, HOST)                                                                     \
    X(UNIT_KEYS, 32, 16, 64, MMA_KT)                                                               \
    X(UNIT_QUERIES, 16, 16, 32, MMA_WQ)                                                            \
    X(UNIT_AHEAD, 128, 0, 1 << 20, HOST)                                                           \
    X(UNIT_ASYNC, 1, 0, 1, HOST)                                                                   \
    X(UNIT_SPLIT, 0, 0, 1 << 30, HOST)                                                             \
    X(LPT, 0, 0, 1, HOST)                                                                          \
    X(LPT_MB, 0, 0, 1 << 16, HOST)                                                                 \
    X(BWD_TILES, 0, 0, 1, HOST)                                                                    \
    X(BWD_GROUP, 128, 1, 1024, HOST)                                                               \
    X(BWD_BLOCK, 16, 1, 64, HOST)                                                                  \
    X(BWD_SLICE, 32, 1, 256, HOST)                                                                 \
    X(BWD_SPLIT_MIN, 0, 0, 1 << 20, HOST)                                                          \
    X(BWD_KEY_TILES, 2, 1, 4, HOST)                                                                \
    X(LANE_TILES, 2, 1, 4, LANE_TILES)

/* Linear attention. LANES: head-dim vector width (narrowed at launch to divide the head dims);
 * ROWS: state rows per linear_states work-item, BM: queries per linear_outputs work-item, and
 * queries or keys per work-item of the backward's (0: as many as keep 16 vector accumulators:
 * a row of VALUE_DIM, in the backward of both head dims); GROUP: work-group size; ITEMS: work-items
 * per compute unit the non-causal chunking aims for; CHUNK: keys per causal chunk. TILES 1: the
 * states and the outputs as group tiles (cl/linear_attention.cl, Tiles): a group's block of
 * BLOCK x BLOCK outputs (less where a head dim is smaller), a work-item's TILE_ROWS x TILE_COLS
 * of it (TILE_COLS widened to the lanes), TILE_STEP keys or head dims staged a step; the other
 * parameters then size the row kernels of what the tiles do not take (phi(k), the scan, the
 * outputs of calls with fewer queries than a block). RECURRENT: a step of at most that many
 * tokens runs the one-kernel recurrent form (0: never).
 * Default: PoCL on AVX-512: 16 lanes, 16 accumulators, causal chunks of 64 (32 and 128 were
 * 1.2-1.8x slower at S=1024-8192, clattn-bench --op linear_attention_causal). */
#define CLATTN__TUNING_LINEAR_ATTENTION(X)                                                         \
    X(LANES, 16, 1, 16, VEC)                                                                       \
    X(ROWS, 0, 0, 8, ROWS)                                                                         \
    X(BM, 0, 0, 8, BM)                                                                             \
    X(GROUP, 16, 1, 1024, HOST)                                                                    \
    X(ITEMS, 64, 1, 1 << 20, HOST)                                                                 \
    X(CHUNK, 64, 1, 4096, HOST)                                                                    \
    X(TILES, 0, 0, 1, HOST)                                                                        \
    X(TILE_ROWS, 8, 1, 8, TR)                                                                      \
    X(TILE_COLS, 8, 1, 32, TC)                                                                     \
    X(TILE_STEP, 16, 1, 64, TS)                                                                    \
    X(BLOCK, 64, 8, 256, HOST)                                                                     \
    X(RECURRENT, 8, 0, 64, HOST)

/* CLBlast's Xgemm kernel (its GEMMK=0 form, the one whose constraints tuning.c checks): MWG,
 * NWG, KWG tile sizes; MDIMC x NDIMC work-items a group; MDIMA, NDIMB the shapes A and B tiles
 * are loaded in; KWI the unroll; VWM, VWN vector widths; STRM, STRN strided access; SA, SB local
 * memory for A and B. MIN_INDIRECT: CLBlast's XGEMM_MIN_INDIRECT_SIZE, from which size
 * (m*n*k >= MIN_INDIRECT^3) a GEMM takes the Xgemm kernel rather than the direct one, whose
 * parameters the row does not hold. No default row: a device without one keeps CLBlast's own
 * database (the DEFAULT column is CLBlast's generic parameters, used by no lookup). The values
 * reach CLBlast through its API, not as clattn build options. */
#define CLATTN__TUNING_GEMM(X)                                                                     \
    X(MWG, 64, 1, 256, HOST)                                                                       \
    X(NWG, 64, 1, 256, HOST)                                                                       \
    X(KWG, 32, 1, 256, HOST)                                                                       \
    X(MDIMC, 16, 1, 64, HOST)                                                                      \
    X(NDIMC, 16, 1, 64, HOST)                                                                      \
    X(MDIMA, 16, 1, 64, HOST)                                                                      \
    X(NDIMB, 16, 1, 64, HOST)                                                                      \
    X(KWI, 2, 1, 64, HOST)                                                                         \
    X(VWM, 2, 1, 16, HOST)                                                                         \
    X(VWN, 2, 1, 16, HOST)                                                                         \
    X(STRM, 1, 0, 1, HOST)                                                                         \
    X(STRN, 1, 0, 1, HOST)                                                                         \
    X(SA, 1, 0, 1, HOST)                                                                           \
    X(SB, 1, 0, 1, HOST)                                                                           \
    X(MIN_INDIRECT, 384, 1, 1 << 16, HOST)

/* Which GEMM runs MHA's projections and the composed attention path, and clattn's own.
 * KERNEL: 0 CLBlast's SGEMM (with the gemm row below, where the device has one), 1 clattn's
 * matmul_tiles (cl/matmul.cl): a work-item (groups of one) per MR rows x PANELS panels of NV
 * vectors of VEC columns, B packed k-major a panel at a time, MR x NV vector accumulators.
 * UNITS 1: MHA with f16 or bf16 storage keeps its projections in that dtype and multiplies on
 * matmul_mma (matrix-unit products, f32 accumulators) wherever clattn_matrix_units found the
 * unit for it, whatever KERNEL says (0: the f32 GEMMs above, on f32 images); UNIT_M, UNIT_N:
 * matmul_mma's rows (16 or 32) and columns (16, 32 or 64) a warp, a group of 2 x 2 warps;
 * UNIT_AHEAD 1: it fetches the next 32-deep slice into registers while it multiplies one.
 * UNIT_F32 1: every f32 GEMM (MHA's projections, the composed attention's products) runs on
 * matmul_mma's 3xTF32 products where the probes found NVIDIA's tf32 unit, whatever KERNEL says;
 * errors within a few times f32's own, NaN and Inf outputs as f32's (docs/design.md), as
 * attention's UNIT_F32.
 * Default: CLBlast (its database knows GPUs); CPUs take the kernel (tuning_table.def). */
#define CLATTN__TUNING_MATMUL(X)                                                                   \
    X(KERNEL, 0, 0, 1, HOST)                                                                       \
    X(MR, 8, 1, 16, MR)                                                                            \
    X(NV, 2, 1, 4, NV)                                                                             \
    X(VEC, 16, 4, 16, VEC)                                                                         \
    X(PANELS, 4, 1, 64, PANELS)                                                                    \
    X(UNITS, 1, 0, 1, HOST)                                                                        \
    X(UNIT_M, 32, 16, 32, MM_WM)                                                                   \
    X(UNIT_N, 32, 16, 64, MM_WN)                                                                   \
    X(UNIT_AHEAD, 1, 0, 1, MM_AHEAD)                                                               \
    X(UNIT_F32, 1, 0, 1, HOST)

/* The ops the tuning table knows: OP(name, PARAMS, has_default_row), in the order clattn-tune and
 * CLATTN_TUNE list them. */
#define CLATTN__TUNING_OPS(OP)                                                                     \
    OP(copy, CLATTN__TUNING_COPY, 1)                                                               \
    OP(softmax, CLATTN__TUNING_SOFTMAX, 1)                                                         \
    OP(attention, CLATTN__TUNING_ATTENTION, 1)                                                     \
    OP(linear_attention, CLATTN__TUNING_LINEAR_ATTENTION, 1)                                       \
    OP(gemm, CLATTN__TUNING_GEMM, 0)                                                               \
    OP(matmul, CLATTN__TUNING_MATMUL, 1)

#endif
