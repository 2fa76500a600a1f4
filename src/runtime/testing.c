/*
 * Test hooks (read through hooks.h, set through testing.h), fault injection (a counter per site,
 * armed by a test, counted down by the library at that site) and the kernel trace. Not part of the
 * public API.
 */
#include "testing.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static atomic_int hooks[CLATTN__HOOKS] = {-1, -1, -1, -1, -1, -1, -1, -1, -1};
_Static_assert(CLATTN__HOOKS == 9, "a -1 above for every hook");
static _Atomic uint64_t narrow_index_limit = (uint64_t)1 << 31;
static atomic_int countdown[CLATTN__FAULT_SITES];

int clattn__hook_value(clattn__hook hook) {
    return atomic_load(&hooks[hook]);
}

void clattn__hook_set(clattn__hook hook, int value) {
    atomic_store(&hooks[hook], value);
}

uint64_t clattn__narrow_index_limit(void) {
    return atomic_load(&narrow_index_limit);
}

uint64_t clattn__narrow_index_limit_set(uint64_t limit) {
    return atomic_exchange(&narrow_index_limit, limit);
}

void clattn__fault_arm(clattn__fault_site site, int n) {
    atomic_store(&countdown[site], n > 0 ? n : 0);
}

bool clattn__fault_hit(clattn__fault_site site) {
    int left = atomic_load(&countdown[site]);
    /* a compare-exchange loop, so that of two threads counting at once only one hits */
    while (left > 0)
        if (atomic_compare_exchange_weak(&countdown[site], &left, left - 1)) return left == 1;
    return false;
}

/* The trace holds the kernels of one call or a few: a benchmark takes them after each. */
#define TRACE_MOST 256
static atomic_bool tracing;
static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static clattn__traced_kernel traced[TRACE_MOST];
static size_t traced_count;

bool clattn__tracing(void) {
    return atomic_load(&tracing);
}

void clattn__trace_record(const char *name, cl_event event) {
    pthread_mutex_lock(&trace_lock);
    if (atomic_load(&tracing) && traced_count < TRACE_MOST && clRetainEvent(event) == CL_SUCCESS) {
        snprintf(traced[traced_count].name, sizeof traced[0].name, "%s", name);
        traced[traced_count++].event = event;
    }
    pthread_mutex_unlock(&trace_lock);
}

static void drop_traced(size_t from) {
    for (size_t i = from; i < traced_count; ++i) clReleaseEvent(traced[i].event);
    traced_count = 0;
}

void clattn__trace_kernels(bool on) {
    pthread_mutex_lock(&trace_lock);
    if (on) drop_traced(0);
    atomic_store(&tracing, on);
    pthread_mutex_unlock(&trace_lock);
}

size_t clattn__trace_take(clattn__traced_kernel *out, size_t capacity) {
    pthread_mutex_lock(&trace_lock);
    const size_t moved = traced_count < capacity ? traced_count : capacity;
    memcpy(out, traced, moved * sizeof *out);
    drop_traced(moved);
    pthread_mutex_unlock(&trace_lock);
    return moved;
}
