/* Matrix units behind capability probes (cl/mma.cl): which mechanisms a device can use, each
 * proven by an exact product on that device before any kernel relies on it. Not installed. */
#ifndef CLATTN_RUNTIME_MATRIX_UNITS_H
#define CLATTN_RUNTIME_MATRIX_UNITS_H

#include "launch.h"
#include "status.h"

#include <stdbool.h>

/* The call's device's mechanisms (CLATTN_MATRIX_* bits), probed on the call's queue once per
 * (context, device) and cached until clattn_cache_clear(context). */
int clattn__matrix_units(const clattn__call *call, unsigned *units);
/* Whether the units clattn__matrix_units reports are the emulated ones (a test hook offers
 * them to every device): kernels on them must then build the emulation, not the instruction. */
bool clattn__matrix_units_emulated(void);
/* Drops the cached probe results of `context` (NULL: of every context). */
void clattn__matrix_units_clear(cl_context context);
/* Builds cl/mma.cl's matrix_probe with `options` (MMA_T, MMA_PTX, ...) and runs it on the known
 * product: *exact tells whether every element came back exact. A program that does not build
 * is not exact (the build log goes to the log callback); a failing enqueue or read is an error. */
int clattn__matrix_probe(const clattn__call *call, const char *options, bool *exact);

#endif
