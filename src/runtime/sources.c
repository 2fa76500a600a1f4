/*
 * Kernel sources: the embedded copies of the cl/ files (tools/embed_cl.c) or, when
 * CLATTN_KERNEL_DIR is set, the files themselves, joined into one program text per op file.
 */
#include "sources.h"
#include "hash.h"
#include "status.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int read_file(const char *dir, const char *name, char **text, long *length) {
    size_t path_len = strlen(dir) + strlen(name) + 2;
    char *path = malloc(path_len);
    if (!path) return clattn__fail(CLATTN_ERR_OUT_OF_HOST_MEMORY, "no memory for a path");
    snprintf(path, path_len, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    long n = -1;
    char *data = NULL;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        data = malloc((size_t)n + 1);
        if (data && fread(data, 1, (size_t)n, f) != (size_t)n) {
            free(data);
            data = NULL;
        }
    }
    if (f) fclose(f);
    if (!data) {
        int status = clattn__fail(CLATTN_ERR_KERNEL_SOURCE,
                                  "cannot read kernel source %s (CLATTN_KERNEL_DIR)", path);
        free(path);
        return status;
    }
    free(path);
    data[n] = '\0';
    *text = data;
    *length = n;
    return CLATTN_SUCCESS;
}

/* One source file's text: from CLATTN_KERNEL_DIR when set (malloc'ed, *owned = true), else the
 * embedded copy. */
static int load_source(const char *name, const char **text, long *length, bool *owned) {
    const char *dir = getenv("CLATTN_KERNEL_DIR");
    if (dir && *dir) {
        char *data = NULL;
        int status = read_file(dir, name, &data, length);
        *text = data;
        *owned = true;
        return status;
    }
    for (size_t i = 0; i < clattn__embedded_sources_count; ++i)
        if (strcmp(clattn__embedded_sources[i].name, name) == 0) {
            *text = clattn__embedded_sources[i].text;
            *length = clattn__embedded_sources[i].length;
            *owned = false;
            return CLATTN_SUCCESS;
        }
    return clattn__fail(CLATTN_ERR_KERNEL_SOURCE, "no embedded kernel source named %s", name);
}

/* The files an op file is built after, in order. common.cl comes first for every op; an op
 * that masks scores needs mask.cl too, and one that walks [B,H,S,D] rows rows.cl; linear
 * attention's backward builds after its forward's file (the feature map, the state layout). */
#define CLATTN_MAX_PARTS 6
static bool op_in(const char *op_file, const char *const *ops, size_t count) {
    for (size_t i = 0; i < count; ++i)
        if (strcmp(op_file, ops[i]) == 0) return true;
    return false;
}

static int program_parts(const char *op_file, const char *names[CLATTN_MAX_PARTS]) {
    static const char *const masked_ops[] = {"softmax.cl", "attention.cl", "attention_backward.cl",
                                             "linear_attention.cl", "linear_attention_backward.cl"};
    static const char *const row_ops[] = {"attention.cl", "attention_backward.cl",
                                          "linear_attention.cl", "linear_attention_backward.cl"};
    int count = 0;
    names[count++] = "common.cl";
    if (op_in(op_file, masked_ops, sizeof masked_ops / sizeof masked_ops[0]))
        names[count++] = "mask.cl";
    if (op_in(op_file, row_ops, sizeof row_ops / sizeof row_ops[0])) names[count++] = "rows.cl";
    if (strcmp(op_file, "attention.cl") == 0 || strcmp(op_file, "matmul.cl") == 0)
        names[count++] = "mma.cl"; /* attention_mma, matmul_mma */
    if (strcmp(op_file, "linear_attention_backward.cl") == 0)
        names[count++] = "linear_attention.cl";
    names[count++] = op_file;
    return count;
}

int clattn__program_source(const char *op_file, char **text) {
    const char *names[CLATTN_MAX_PARTS];
    const char *parts[CLATTN_MAX_PARTS] = {NULL};
    long lengths[CLATTN_MAX_PARTS] = {0};
    bool owned[CLATTN_MAX_PARTS] = {false};
    int count = program_parts(op_file, names);
    int status = CLATTN_SUCCESS;
    size_t capacity = 1;
    for (int i = 0; i < count && status == CLATTN_SUCCESS; ++i) {
        status = load_source(names[i], &parts[i], &lengths[i], &owned[i]);
        capacity += (size_t)lengths[i] + strlen(names[i]) + 32;
    }
    char *out = status == CLATTN_SUCCESS ? malloc(capacity) : NULL;
    if (status == CLATTN_SUCCESS && !out)
        status = clattn__fail(CLATTN_ERR_OUT_OF_HOST_MEMORY, "no memory for kernel source");
    size_t used = 0;
    for (int i = 0; i < count && out; ++i)
        used += (size_t)snprintf(out + used, capacity - used, "#line 1 \"cl/%s\"\n%s\n", names[i],
                                 parts[i]);
    *text = out;
    for (int i = 0; i < count; ++i)
        if (owned[i]) free((char *)parts[i]);
    return status;
}

int clattn__program_stamp(const char *op_file, uint64_t *stamp) {
    const char *dir = getenv("CLATTN_KERNEL_DIR"), *names[CLATTN_MAX_PARTS];
    const int count = program_parts(op_file, names);
    uint64_t h = clattn__hash_bytes(CLATTN__HASH_START, dir ? dir : "", dir ? strlen(dir) : 0);
    for (int i = 0; i < count; ++i) {
        char path[4096];
        struct stat st;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir ? dir : ".", names[i]) >=
                sizeof path ||
            stat(path, &st) != 0)
            return clattn__fail(CLATTN_ERR_KERNEL_SOURCE,
                                "cannot read kernel source %s (CLATTN_KERNEL_DIR)", path);
        /* the change time too: no one sets it, and a write or a rename moves it even where the
         * size and the modification time stay (cp -p, a rewrite within the clock's tick) */
        const uint64_t fields[7] = {(uint64_t)st.st_size,         (uint64_t)st.st_mtim.tv_sec,
                                    (uint64_t)st.st_mtim.tv_nsec, (uint64_t)st.st_ctim.tv_sec,
                                    (uint64_t)st.st_ctim.tv_nsec, (uint64_t)st.st_ino,
                                    (uint64_t)st.st_dev};
        h = clattn__hash_bytes(h, fields, sizeof fields);
    }
    *stamp = h;
    return CLATTN_SUCCESS;
}
