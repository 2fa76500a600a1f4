/* What only tests (and the benchmark: the kernel trace) call: hooks, fault injection, leak
 * counters, the kernel trace. Not installed. */
#ifndef CLATTN_RUNTIME_TESTING_H
#define CLATTN_RUNTIME_TESTING_H

#include "hooks.h"

/* Sets a hook (hooks.h); -1 restores the library's own choice. */
void clattn__hook_set(clattn__hook hook, int value);
/* Sets the narrow-index limit (hooks.h); returns the one it replaces. */
uint64_t clattn__narrow_index_limit_set(uint64_t limit);
/* Arms `site` to fail at its n-th use from now (n >= 1), once; n = 0 disarms it. */
void clattn__fault_arm(clattn__fault_site site, int n);
/* Scratch buffers the library has allocated and OpenCL has not yet destroyed (the tests check
 * that a failing call leaks none). */
long clattn__scratch_live(void);
/* A row the tuning lookup tries before the table's ({op, dtype, device, parameters}); op NULL
 * (or a NULL row) removes it. */
void clattn__tuning_set_test_row(const char *const row[4]);

/* The kernels the program cache keeps (program_cache.c), and how many of them calls hold now. */
void clattn__kept_kernels(size_t *kept, size_t *lent);
/* The clSetKernelArg calls this thread's argument setters have made (kernel_args.c): a scalar
 * the kernel holds already is not set again. */
size_t clattn__args_driver_sets(void);

/* A kernel the trace (hooks.h) recorded: its name, and its event, which the taker releases. */
typedef struct clattn__traced_kernel {
    char name[64];
    cl_event event;
} clattn__traced_kernel;
/* Turns the kernel trace on (dropping what it held) or off. */
void clattn__trace_kernels(bool on);
/* Moves up to `capacity` recorded kernels into `out` in the order they were enqueued, drops the
 * rest; returns how many it moved. */
size_t clattn__trace_take(clattn__traced_kernel *out, size_t capacity);

#endif
