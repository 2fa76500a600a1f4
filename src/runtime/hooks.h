/* Test hooks as the library reads them. Not installed. */
#ifndef CLATTN_RUNTIME_HOOKS_H
#define CLATTN_RUNTIME_HOOKS_H

#include "clattn.h"

#include <stdbool.h>
#include <stdint.h>

/* What a test may change in the library's choices, as the library reads it. The setters are in
 * testing.h, which only tests include; testing.c holds both sides. Each reads -1 until a test sets
 * it. */
typedef enum clattn__hook {
    CLATTN__HOOK_SOFTMAX_VARIANT,   /* softmax kernel variant (ops/softmax.c) */
    CLATTN__HOOK_ATTENTION_VARIANT, /* fused attention kernel variant (ops/attention.c) */
    CLATTN__HOOK_ATTENTION_SPLITS,  /* > 0: split the keys that many ways */
    CLATTN__HOOK_ATTENTION_ORDER,   /* >= 0: the groups' order, whatever the mask (unit_place) */
    CLATTN__HOOK_LINEAR_LAUNCH,     /* linear attention's launch row (ops/linear_attention.c) */
    CLATTN__HOOK_MATRIX_EMULATION,  /* 1-5: every device probes that tile unit, emulated */
    CLATTN__HOOK_GRID_GROUPS,       /* > 0: the copies' work-groups along grid dims 1 and 2 */
    CLATTN__HOOK_ROW_SPLITS,        /* > 0: split the backward keys pass's rows that many ways */
    CLATTN__HOOK_KEY_TILES,         /* > 0: the backward lanes keys pass's tiles a work-item */
    CLATTN__HOOKS
} clattn__hook;
int clattn__hook_value(clattn__hook hook);

/* Softmax kernel variants (cl/softmax.cl). */
enum { CLATTN__SOFTMAX_ROWS = 0, CLATTN__SOFTMAX_GROUP = 1 };
/* Fused attention kernel variants (cl/attention.cl). */
enum {
    CLATTN__ATTENTION_BLOCKS = 0,
    CLATTN__ATTENTION_TILES = 1,
    CLATTN__ATTENTION_KEYS = 2,
    CLATTN__ATTENTION_LANES = 3,
    CLATTN__ATTENTION_MICRO = 4,
    CLATTN__ATTENTION_MMA = 5,
    CLATTN__ATTENTION_UNITS = 6,
    CLATTN__ATTENTION_VARIANTS
};
/* Linear attention launch rows (the tuning table's "default" and "type:gpu" rows). */
enum { CLATTN__LINEAR_CPU = 0, CLATTN__LINEAR_GPU = 1 };

/* Kernels index with 32-bit integers when every element offset of a call is below this limit
 * (2^31, so that an offset plus a run or a size still fits in 32 bits), and with 64-bit ones
 * otherwise. Tests lower it to exercise the 64-bit path on small tensors. */
uint64_t clattn__narrow_index_limit(void);

/* The places a test can make fail: a program build (the source gets an #error, so the driver's
 * real failure path and log run), the library's scratch allocation (as
 * CL_MEM_OBJECT_ALLOCATION_FAILURE), and a GEMM (CLBlast's: as CLBlast's own error code;
 * clattn's kernel: its product's enqueue as CL_OUT_OF_RESOURCES, after b's packing was
 * enqueued). */
typedef enum clattn__fault_site {
    CLATTN__FAULT_BUILD,
    CLATTN__FAULT_ALLOC,
    CLATTN__FAULT_GEMM,
    CLATTN__FAULT_SITES
} clattn__fault_site;
/* Counts one use of `site`: true when it is the armed one (which disarms it). Unarmed, a site
 * costs one atomic load. */
bool clattn__fault_hit(clattn__fault_site site);

/* The kernel trace (testing.h turns it on, for a benchmark's breakdown of a call): while it is
 * on, the launches record each kernel they enqueue by name with its event. Off, clattn__tracing
 * costs one atomic load. */
bool clattn__tracing(void);
void clattn__trace_record(const char *name, cl_event event);

#endif
