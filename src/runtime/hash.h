/* FNV-1a, the 64-bit hash of the program cache's keys and the kernel sources' stamps. Not
 * installed. */
#ifndef CLATTN_RUNTIME_HASH_H
#define CLATTN_RUNTIME_HASH_H

#include <stddef.h>
#include <stdint.h>

#define CLATTN__HASH_START 1469598103934665603ull /* FNV-1a's offset basis */

/* h carried over `size` bytes at `data` (start from CLATTN__HASH_START). */
uint64_t clattn__hash_bytes(uint64_t h, const void *data, size_t size);

#endif
