/* Program binaries: export, import and the on-disk cache. Not installed. */
#ifndef CLATTN_RUNTIME_PROGRAM_BINARY_H
#define CLATTN_RUNTIME_PROGRAM_BINARY_H

#include "status.h"

/* program_binary.c serializes cached programs (clattn_cache_export/import) and keeps the opt-in
 * on-disk cache (CLATTN_CACHE_DIR). */

/* The parsing clattn_cache_import does before it compares an entry with the device and hands
 * its binary to the driver: the entries of data[0, size) it can step over (*corrupt of them
 * with a wrong checksum or strings), and the bytes they take. For the fuzz target, which must
 * not give forged binaries to a driver (README, Known limits). */
size_t clattn__cache_blob_scan(const void *data, size_t size, size_t *entries, size_t *corrupt);

/* The on-disk cache, when CLATTN_CACHE_DIR is set (read at each call; unset: both do nothing).
 * load: true with a built program in *out when <dir>/<hash>.clbin holds a valid entry for this
 * device identity, options and text; anything else is a miss (false). store: writes the entry
 * for a program just built, atomically (a temporary file renamed over the name); a failure is a
 * clattn__warn, never an error. Neither records a last error. */
bool clattn__disk_cache_load(cl_context context, cl_device_id device, const char *op_file,
                             const char *options, uint64_t text_hash, cl_program *out);
void clattn__disk_cache_store(cl_device_id device, const char *op_file, const char *options,
                              uint64_t text_hash, cl_program program);

#endif
