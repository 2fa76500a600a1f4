/* Matrix units behind capability probes (cl/mma.cl): which mechanisms a device can use, each
 * proven by an exact product on that device before any kernel relies on it. Not installed. */
#ifndef CLATTN_RUNTIME_MATRIX_UNITS_H
#define CLATTN_RUNTIME_MATRIX_UNITS_H

#include "launch.h"
#include "status.h"

#include <stdbool.h>
#include <stdint.h>

/* The subgroup tile of a mechanism (cl/mma.cl): MMA_UNIT's value, 0 for none, and MMA_SG. */
typedef enum clattn__tile_unit {
    CLATTN__TILE_NV = 1,
    CLATTN__TILE_WMMA = 2,
    CLATTN__TILE_MFMA = 3,
    CLATTN__TILE_DPAS8 = 4,
    CLATTN__TILE_DPAS16 = 5,
} clattn__tile_unit;
typedef struct clattn__tile {
    int unit, subgroup;
} clattn__tile;

/* The call's device's mechanisms (CLATTN_MATRIX_* bits), probed on the call's queue once per
 * (context, device) and cached until clattn_cache_clear(context). */
int clattn__matrix_units(const clattn__call *call, unsigned *units);
/* The subgroup tile kernels on `type` inputs use on the call's device: the first mechanism of
 * that type whose probes passed, or unit 0. For f32, NVIDIA's warp (the tf32 unit's 3xTF32
 * products, cl/mma.cl) where mma-tf32 passed; only a device offered that unit (or, under the
 * emulation hook, every device) probes for an f32 call. */
int clattn__matrix_tile(const clattn__call *call, clattn_dtype type, clattn__tile *tile);
/* cl/mma.cl's MMA_TILE_SCRATCH: the local floats a subgroup's products take on `tile`, native or
 * emulated (NVIDIA's emulation A and B of one m16n8k16, the others' A and B of a tile, a native
 * build one). */
uint64_t clattn__tile_scratch_floats(const clattn__tile *tile, bool emulated);
/* The units whose native probes `device` is offered (its extensions and architecture say it
 * may have them), as CLATTN_MATRIX_* bits: what clattn__matrix_units tries there. */
unsigned clattn__matrix_offered(cl_device_id device);
/* Whether the units clattn__matrix_units reports are the emulated ones (a test hook offers
 * them to every device): kernels on them must then build the emulation, not the instruction. */
bool clattn__matrix_units_emulated(void);
/* Drops the cached probe results of `context` (NULL: of every context). */
void clattn__matrix_units_clear(cl_context context);
/* Builds cl/mma.cl's probes with `options` (MMA_T, MMA_UNIT, MMA_NATIVE, ...) and runs one on
 * the known product: *exact tells whether every element came back exact. A program that does not
 * build or does not launch is not exact (the build log goes to the log callback); a failing read
 * is an error. matrix_probe: NVIDIA's warp primitives, a warp of 32; tile_probe: the subgroup tile,
 * a subgroup of `subgroup` work-items. */
int clattn__matrix_probe(const clattn__call *call, const char *options, bool *exact);
int clattn__tile_probe(const clattn__call *call, const char *options, int subgroup, bool *exact);
/* tf32_probe: the 3xTF32 products (MMA_T f32), a warp of 32. */
int clattn__tf32_probe(const clattn__call *call, const char *options, bool *exact);

#endif
