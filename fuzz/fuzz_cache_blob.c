/*
 * libFuzzer target: the parsing that clattn_cache_import and the on-disk cache
 * (CLATTN_CACHE_DIR) do on a blob of program-binary entries before anything reaches the driver,
 * through clattn__cache_blob_scan (src/runtime/program_binary.c). No binary is ever given to the
 * driver: a forged one with a right checksum would be (README, Known limits).
 *
 * The first byte is a flag: odd, the target rewrites each entry's checksum the way the export
 * writes it, so that inputs also reach what is checked after the checksum (the strings); the rest
 * is the blob. The layout (src/runtime/program_binary.c, write_entry): 8 bytes "CLATTNPB", u32
 * version, u64 source hash, u64 binary size, six u32 string lengths, the strings, the binary, then
 * u64 FNV-1a of everything before it, all little-endian.
 *
 * Invariants: no sanitizer report; the scan stops inside the blob, and counts no more corrupt
 * entries than entries, and no more entries than the blob can hold.
 */
#include "common.h"

#include <stdlib.h>
#include <string.h>

enum { HEADER = 52, CHECKSUM = 8, STRINGS = 6 };

static uint64_t get_le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = v << 8 | p[i];
    return v;
}

/* Rewrites the checksum of each entry whose lengths fit, as the export computes it. */
static void repair_checksums(uint8_t *blob, size_t size) {
    size_t at = 0;
    while (size - at >= HEADER + CHECKSUM && memcmp(blob + at, "CLATTNPB", 8) == 0) {
        uint64_t n = HEADER;
        for (int i = 0; i < STRINGS; ++i) n += get_le(blob + at + 28 + 4 * i, 4);
        uint64_t binary = get_le(blob + at + 20, 8);
        if (binary > size - at || n > size - at - binary || n + binary + CHECKSUM > size - at)
            return;
        n += binary;
        uint64_t h = 1469598103934665603ull;
        for (uint64_t i = 0; i < n; ++i) h = (h ^ blob[at + i]) * 1099511628211ull;
        for (int i = 0; i < 8; ++i) blob[at + n + i] = (uint8_t)(h >> (8 * i));
        at += n + CHECKSUM;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    size_t n = size - 1;
    uint8_t *blob = malloc(n ? n : 1); /* a copy of its own, so ASan sees reads past its end */
    if (!blob) fuzz_fail("out of memory");
    memcpy(blob, data + 1, n);
    if (data[0] & 1) repair_checksums(blob, n);
    size_t entries = 0, corrupt = 0;
    size_t used = clattn__cache_blob_scan(blob, n, &entries, &corrupt);
    free(blob);
    if (used > n) fuzz_fail("the scan stepped to byte %zu of %zu", used, n);
    if (corrupt > entries) fuzz_fail("%zu corrupt entries of %zu", corrupt, entries);
    if (entries > n / (HEADER + CHECKSUM))
        fuzz_fail("%zu entries in %zu bytes, each at least %d", entries, n, HEADER + CHECKSUM);
    return 0;
}
