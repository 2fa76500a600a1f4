/*
 * Test hooks (read through hooks.h, set through testing.h) and fault injection: a counter per site,
 * armed by a test, counted down by the library at that site. Not part of the public API.
 */
#include "testing.h"

#include <stdatomic.h>

static atomic_int hooks[CLATTN__HOOKS] = {-1, -1, -1, -1, -1};
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
