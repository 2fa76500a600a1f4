/* The program cache. Not installed. */
#ifndef CLATTN_RUNTIME_PROGRAM_CACHE_H
#define CLATTN_RUNTIME_PROGRAM_CACHE_H

#include "kernel_args.h"
#include "status.h"

/* The program cache (program_cache.c): programs keyed by (context, device, source key,
 * options). A program's text hash is the FNV-1a 64 hash of the full source text it is built
 * from (embedded or not), which is what a binary is checked against (program_binary.c). */

/* A cached program as export sees it: retained, with copies of its key. */
typedef struct clattn__cached_program {
    cl_program program;
    char *op_file, *options;
    uint64_t text_hash;
} clattn__cached_program;
/* The programs cached for (context, device), each retained, in a malloc'ed *list (NULL when
 * *count is 0). Statuses: CLATTN_SUCCESS, CLATTN_ERR_OUT_OF_HOST_MEMORY. */
int clattn__cache_snapshot(cl_context context, cl_device_id device, clattn__cached_program **list,
                           size_t *count);
void clattn__cache_snapshot_free(clattn__cached_program *list, size_t count);
/* The cache key and the text hash that the next build of `op_file` would have. Statuses:
 * clattn__program_source's. */
int clattn__program_hashes(const char *op_file, uint64_t *key, uint64_t *text_hash);
/* Adds a program made from a binary (the cache takes the caller's reference) under `key`; not a
 * build for clattn_cache_stats. False, with the program released, when that key is cached
 * already or memory runs out. */
bool clattn__cache_adopt(cl_context context, cl_device_id device, const char *op_file,
                         const char *options, uint64_t key, uint64_t text_hash, cl_program program);

/* FNV-1a 64 of a NUL-terminated text. */
uint64_t clattn__text_hash(const char *text);
/* The cache key of an op file's source: embedded sources are keyed by name (*text stays NULL:
 * the text is assembled only on a miss); sources read from CLATTN_KERNEL_DIR by their text,
 * which *text then holds (malloc'ed, the caller frees it), so an edit is picked up without a
 * restart. */
int clattn__program_key(const char *op_file, char **text, uint64_t *key);
/* The cached program for the key, retained for the caller (a hit for clattn_cache_stats), or
 * NULL. */
cl_program clattn__cache_lookup(cl_context context, cl_device_id device, uint64_t key,
                                const char *options);
/* Adds a program just built (is_build) or loaded from disk, taking the caller's reference,
 * unless another thread got there first; returns the program to use, retained for the caller. */
cl_program clattn__cache_insert(cl_context context, cl_device_id device, uint64_t key,
                                const char *op_file, const char *options, uint64_t text_hash,
                                cl_program built, bool is_build);
/* Kernels kept with their program for the next call (program_cache.c, kept_kernel): a kernel
 * of the key's program named `name` that no call holds, now lent to the caller with its memo
 * (the caller's until the take-back; NULL: none yet), or NULL. */
cl_kernel clattn__cache_lend_kernel(cl_context context, cl_device_id device, uint64_t key,
                                    const char *options, const char *name,
                                    clattn__kernel_memo **memo);
/* Keeps a kernel just created from a cached program, as lent to the caller, where the program's
 * entry has a free slot (else the kernel stays the caller's alone). */
void clattn__cache_keep_kernel(cl_program program, const char *name, cl_kernel kernel);
/* Takes back a lent kernel and its memo for the next call (the caller still releases its own
 * reference): false when the cache does not keep it (the memo is freed then). */
bool clattn__cache_take_back_kernel(cl_kernel kernel, clattn__kernel_memo *memo);
/* Stops keeping a kernel, lent or not: frees its slot and the slot's reference (a holder keeps
 * its own). For a kernel that may name a buffer nothing will clear. */
void clattn__cache_forget_kernel(cl_kernel kernel);
/* Drops the programs of `context` (NULL: all), and the kernels kept with them. */
void clattn__program_cache_clear(cl_context context);

#endif
