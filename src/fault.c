/*
 * Fault injection for the tests: a counter per site, armed by a test, counted down by the
 * library at that site. Unarmed, a site costs one atomic load. Not part of the public API.
 */
#include "internal.h"

#include <stdatomic.h>

static atomic_int countdown[CLATTN__FAULT_SITES];

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
