/* Kernel sources: embedded at build time (tools/embed_cl.c), or read from CLATTN_KERNEL_DIR. */
#ifndef CLATTN_SOURCES_H
#define CLATTN_SOURCES_H

#include <stddef.h>
#include <stdint.h>

typedef struct clattn__source_file {
    const char *name; /* base name, "heads.cl" */
    const char *text;
    long length;
} clattn__source_file;

extern const clattn__source_file clattn__embedded_sources[];
extern const size_t clattn__embedded_sources_count;

/* The full program text of one op file: common.cl, the files it needs (mask.cl for the ops that
 * mask scores), then the op file, each behind a #line marker
 * naming the real file, so build logs point at cl/<file>:<line>. Reads from CLATTN_KERNEL_DIR
 * when it is set. On success *text is malloc'ed and the caller frees it.
 * Statuses: CLATTN_SUCCESS, CLATTN_ERR_KERNEL_SOURCE, CLATTN_ERR_OUT_OF_HOST_MEMORY. */
int clattn__program_source(const char *op_file, char **text);

/* A stamp of the CLATTN_KERNEL_DIR files that op_file's program is joined from: their sizes,
 * modification and change times and inodes, hashed, so that it changes when a file is edited (the
 * program cache re-reads and re-hashes the text only then). Statuses: CLATTN_SUCCESS,
 * CLATTN_ERR_KERNEL_SOURCE.
 */
int clattn__program_stamp(const char *op_file, uint64_t *stamp);

#endif
