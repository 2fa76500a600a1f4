/*
 * Kernel sources and the program cache.
 *
 * A program is the text of common.cl plus one op file, built for one device with one options
 * string. Builds are lazy and cached per (context, device, source hash, options). The lock guards
 * only the table: a build runs unlocked, so two threads that miss at once may both build; the
 * second to finish keeps the first's program and drops its own. Entries also keep their op file
 * and the hash of their full text, for clattn_cache_export; binaries, exported or on disk
 * (CLATTN_CACHE_DIR), are program_binary.c's.
 */
#include "blas.h"
#include "internal.h"
#include "sources.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- sources ---- */

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
 * that masks scores needs mask.cl too, and one that walks [B,H,S,D] rows rows.cl. */
#define CLATTN_MAX_PARTS 4
static bool op_in(const char *op_file, const char *const *ops, size_t count) {
    for (size_t i = 0; i < count; ++i)
        if (strcmp(op_file, ops[i]) == 0) return true;
    return false;
}

static int program_parts(const char *op_file, const char *names[CLATTN_MAX_PARTS]) {
    static const char *const masked_ops[] = {"softmax.cl", "attention.cl", "linear_attention.cl"};
    static const char *const row_ops[] = {"attention.cl", "linear_attention.cl"};
    int count = 0;
    names[count++] = "common.cl";
    if (op_in(op_file, masked_ops, sizeof masked_ops / sizeof masked_ops[0]))
        names[count++] = "mask.cl";
    if (op_in(op_file, row_ops, sizeof row_ops / sizeof row_ops[0])) names[count++] = "rows.cl";
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

/* ---- the cache ---- */

typedef struct cache_entry {
    struct cache_entry *next;
    cl_context context;
    cl_device_id device;
    uint64_t source_hash;
    char *options;
    cl_program program;
    char *op_file;
    uint64_t text_hash; /* of the full text, even where source_hash is the file name's */
} cache_entry;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static cache_entry *cache_head;
static size_t cache_builds, cache_hits;

/* FNV-1a, 64 bit: the key needs only to tell edited sources apart. */
static uint64_t hash_text(const char *text) {
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)text; *p; ++p)
        h = (h ^ *p) * 1099511628211ull;
    return h;
}

/* Caller holds cache_lock. Returns a retained program or NULL. */
static cl_program cache_find(cl_context context, cl_device_id device, uint64_t hash,
                             const char *options) {
    for (cache_entry *e = cache_head; e; e = e->next)
        if (e->context == context && e->device == device && e->source_hash == hash &&
            strcmp(e->options, options) == 0) {
            clRetainProgram(e->program);
            return e->program;
        }
    return NULL;
}

/* The joined source's line `joined` as a file and line: each part starts with a line
 * `#line 1 "cl/NAME"`, so the file's line 1 is the line after it. False before the first. */
static bool joined_line_origin(const char *text, long joined, char *name, size_t name_size,
                               long *file_line) {
    static const char marker[] = "#line 1 \"";
    long line = 1;
    bool found = false;
    for (const char *p = text; *p && line <= joined; ++line) {
        if (strncmp(p, marker, sizeof marker - 1) == 0) {
            const char *start = p + sizeof marker - 1, *end = strchr(start, '"');
            size_t n = end ? (size_t)(end - start) : 0;
            if (n >= name_size) n = name_size - 1;
            memcpy(name, start, n);
            name[n] = '\0';
            *file_line = line;
            found = true;
        }
        const char *next = strchr(p, '\n');
        p = next ? next + 1 : p + strlen(p);
    }
    if (found) *file_line = joined - *file_line;
    return found && *file_line >= 1;
}

/* The length of the name a compiler that ignores #line gives the joined source, when `p`
 * starts with one followed by ':'; else 0. */
static size_t joined_source_tag(const char *p) {
    static const char *const tags[] = {"<kernel>:", /* NVIDIA */ "input.cl:" /* Oclgrind */};
    for (size_t i = 0; i < sizeof tags / sizeof tags[0]; ++i)
        if (strncmp(p, tags[i], strlen(tags[i])) == 0) return strlen(tags[i]);
    return 0;
}

/* Some compilers (NVIDIA's, Oclgrind's) ignore #line and count lines of the joined source
 * ("<kernel>:LINE"): rewrite those to "cl/FILE:LINE" so that a log always points into the
 * file to edit. Returns a new string, or NULL when out of memory. */
static char *log_with_file_lines(const char *log, const char *text) {
    size_t capacity = strlen(log) * 2 + 256, used = 0; /* names outgrow numbers */
    char *out = malloc(capacity);
    if (!out) return NULL;
    for (const char *p = log; *p && used + 128 < capacity;) {
        char name[64];
        long file_line = 0;
        char *digits_end = NULL;
        size_t tag = joined_source_tag(p);
        long joined = tag ? strtol(p + tag, &digits_end, 10) : 0;
        if (joined > 0 && joined_line_origin(text, joined, name, sizeof name, &file_line)) {
            used += (size_t)snprintf(out + used, capacity - used, "%s:%ld", name, file_line);
            p = digits_end;
        } else {
            out[used++] = *p++;
        }
    }
    out[used] = '\0';
    return out;
}

static int build_log_failure(cl_program program, cl_device_id device, const char *options,
                             const char *op_file, const char *text) {
    size_t size = 0;
    clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, 0, NULL, &size);
    char *log = malloc(size + 1);
    if (log) {
        log[0] = '\0';
        clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, size, log, NULL);
        log[size] = '\0';
    }
    char *mapped = log ? log_with_file_lines(log, text) : NULL;
    const char *shown = mapped ? mapped : log ? log : "(no memory for the build log)";
    int status =
        clattn__fail(CLATTN_ERR_BUILD_FAILED, "building cl/%s with options \"%s\" failed:\n%s",
                     op_file, options, shown);
    free(mapped);
    free(log);
    return status;
}

static int build_program(cl_context context, cl_device_id device, const char *text,
                         const char *options, const char *op_file, cl_program *out) {
    /* an injected fault (tests) builds the source behind an #error, so that the driver's own
     * failure and build log take the path a real one would */
    const char *texts[2] = {"#error clattn fault injection: this build fails on purpose\n", text};
    const bool fault = clattn__fault_hit(CLATTN__FAULT_BUILD);
    cl_int err;
    cl_program program =
        clCreateProgramWithSource(context, fault ? 2 : 1, fault ? texts : texts + 1, NULL, &err);
    if (err != CL_SUCCESS) return clattn__cl_fail(err, "clCreateProgramWithSource");
    err = clBuildProgram(program, 1, &device, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        int status = err == CL_BUILD_PROGRAM_FAILURE
                         ? build_log_failure(program, device, options, op_file, text)
                         : clattn__cl_fail(err, "clBuildProgram");
        clReleaseProgram(program);
        return status;
    }
    *out = program;
    return CLATTN_SUCCESS;
}

static char *copy_string(const char *text) {
    char *copy = malloc(strlen(text) + 1);
    return copy ? strcpy(copy, text) : NULL;
}

/* Caller holds cache_lock. A new entry that takes the caller's reference to `program`, unless
 * that key is cached (*existing, retained) or memory runs out (false either way). */
static bool cache_add(cl_context context, cl_device_id device, uint64_t hash, const char *op_file,
                      const char *options, uint64_t text_hash, cl_program program,
                      cl_program *existing) {
    *existing = cache_find(context, device, hash, options);
    cache_entry *e = *existing ? NULL : calloc(1, sizeof *e);
    char *options_copy = e ? copy_string(options) : NULL;
    char *op_file_copy = options_copy ? copy_string(op_file) : NULL;
    if (!op_file_copy) {
        free(options_copy);
        free(e); /* already cached, or out of memory */
        return false;
    }
    *e = (cache_entry){.next = cache_head,
                       .context = context,
                       .device = device,
                       .source_hash = hash,
                       .options = options_copy,
                       .program = program,
                       .op_file = op_file_copy,
                       .text_hash = text_hash};
    cache_head = e;
    return true;
}

/* Adds a program just built or loaded from disk (the cache takes the caller's reference) unless
 * another thread got there first; returns the program to use, retained for the caller. */
static cl_program cache_insert(cl_context context, cl_device_id device, uint64_t hash,
                               const char *op_file, const char *options, uint64_t text_hash,
                               cl_program built, bool is_build) {
    pthread_mutex_lock(&cache_lock);
    cl_program existing;
    if (cache_add(context, device, hash, op_file, options, text_hash, built, &existing)) {
        cache_builds += is_build;
        clRetainProgram(built);
    } /* else already cached, or out of memory: use the program uncached */
    pthread_mutex_unlock(&cache_lock);
    if (existing) {
        clReleaseProgram(built);
        return existing;
    }
    return built;
}

/* The cache key of an op file's source. Embedded sources never change within a process, so
 * their key is the file name and the text is assembled only on a miss; sources read from
 * CLATTN_KERNEL_DIR are hashed on every call, so an edit is picked up without a restart. */
static int source_key(const char *op_file, char **text, uint64_t *hash) {
    const char *dir = getenv("CLATTN_KERNEL_DIR");
    *text = NULL;
    if (!(dir && *dir)) {
        *hash = hash_text(op_file) ^ 0x656d626564646564ull; /* "embedded" */
        return CLATTN_SUCCESS;
    }
    int status = clattn__program_source(op_file, text);
    if (status == CLATTN_SUCCESS) *hash = hash_text(*text);
    return status;
}

static int get_program(cl_context context, cl_device_id device, const char *op_file,
                       const char *options, cl_program *out) {
    char *text = NULL;
    uint64_t hash = 0;
    int status = source_key(op_file, &text, &hash);
    if (status != CLATTN_SUCCESS) return status;

    pthread_mutex_lock(&cache_lock);
    cl_program program = cache_find(context, device, hash, options);
    if (program) ++cache_hits;
    pthread_mutex_unlock(&cache_lock);

    if (!program && !text) status = clattn__program_source(op_file, &text);
    if (!program && status == CLATTN_SUCCESS) {
        const uint64_t text_hash = hash_text(text);
        const bool loaded =
            clattn__disk_cache_load(context, device, op_file, options, text_hash, &program);
        if (!loaded) status = build_program(context, device, text, options, op_file, &program);
        if (status == CLATTN_SUCCESS && !loaded)
            clattn__disk_cache_store(device, op_file, options, text_hash, program);
        if (status == CLATTN_SUCCESS)
            program =
                cache_insert(context, device, hash, op_file, options, text_hash, program, !loaded);
    }
    free(text);
    *out = program;
    return status;
}

void clattn_cache_clear(cl_context context) {
    pthread_mutex_lock(&cache_lock);
    cache_entry **link = &cache_head;
    while (*link) {
        cache_entry *e = *link;
        if (!context || e->context == context) {
            *link = e->next;
            clReleaseProgram(e->program);
            free(e->options);
            free(e->op_file);
            free(e);
        } else {
            link = &e->next;
        }
    }
    pthread_mutex_unlock(&cache_lock);
    if (!context) clattn__blas_cache_clear();
}

void clattn_cache_stats(size_t *programs, size_t *builds, size_t *hits) {
    pthread_mutex_lock(&cache_lock);
    size_t count = 0;
    for (cache_entry *e = cache_head; e; e = e->next) ++count;
    if (programs) *programs = count;
    if (builds) *builds = cache_builds;
    if (hits) *hits = cache_hits;
    pthread_mutex_unlock(&cache_lock);
}

/* ---- for program binaries (program_binary.c) ---- */

int clattn__program_hashes(const char *op_file, uint64_t *key, uint64_t *text_hash) {
    char *text = NULL;
    int status = source_key(op_file, &text, key);
    if (status == CLATTN_SUCCESS && !text) status = clattn__program_source(op_file, &text);
    if (status == CLATTN_SUCCESS) *text_hash = hash_text(text);
    free(text);
    return status;
}

bool clattn__cache_adopt(cl_context context, cl_device_id device, const char *op_file,
                         const char *options, uint64_t key, uint64_t text_hash,
                         cl_program program) {
    pthread_mutex_lock(&cache_lock);
    cl_program existing;
    const bool added =
        cache_add(context, device, key, op_file, options, text_hash, program, &existing);
    pthread_mutex_unlock(&cache_lock);
    if (existing) clReleaseProgram(existing);
    if (!added) clReleaseProgram(program);
    return added;
}

int clattn__cache_snapshot(cl_context context, cl_device_id device, clattn__cached_program **list,
                           size_t *count) {
    pthread_mutex_lock(&cache_lock);
    size_t n = 0, filled = 0;
    for (cache_entry *e = cache_head; e; e = e->next)
        n += e->context == context && e->device == device;
    clattn__cached_program *out = n ? calloc(n, sizeof *out) : NULL;
    for (cache_entry *e = cache_head; out && e; e = e->next) {
        if (e->context != context || e->device != device) continue;
        clattn__cached_program *c = &out[filled++];
        *c = (clattn__cached_program){e->program, copy_string(e->op_file), copy_string(e->options),
                                      e->text_hash};
        clRetainProgram(e->program);
        if (!c->op_file || !c->options) {
            clattn__cache_snapshot_free(out, filled);
            out = NULL;
        }
    }
    pthread_mutex_unlock(&cache_lock);
    *list = out;
    *count = out ? n : 0;
    return out || n == 0 ? CLATTN_SUCCESS
                         : clattn__fail(CLATTN_ERR_OUT_OF_HOST_MEMORY,
                                        "no memory for a list of %zu cached programs", n);
}

void clattn__cache_snapshot_free(clattn__cached_program *list, size_t count) {
    for (size_t i = 0; i < count; ++i) {
        clReleaseProgram(list[i].program);
        free(list[i].op_file);
        free(list[i].options);
    }
    free(list);
}

/* ---- kernels ---- */

/* The op's options plus CLATTN_BUILD_OPTIONS (for debugging builds: -cl-opt-disable, -g).
 * Options that relax IEEE semantics (the -cl-*-math family, mad, signed zeros) are refused:
 * the masks rely on infinities and NaN, the tests on exact results. */
static int full_options(const char *options, char *out, size_t capacity) {
    static const char *const refused[] = {"math", "mad-enable", "signed-zeros"};
    const char *extra = getenv("CLATTN_BUILD_OPTIONS");
    if (!extra) extra = "";
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; ++i)
        if (strstr(extra, refused[i]))
            return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                                "CLATTN_BUILD_OPTIONS \"%s\": options with \"%s\" are refused "
                                "(clattn relies on IEEE infinities and NaN)",
                                extra, refused[i]);
    if ((size_t)snprintf(out, capacity, "%s %s", options, extra) >= capacity)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "build options longer than %zu bytes",
                            capacity);
    return CLATTN_SUCCESS;
}

int clattn__create_kernel(cl_context context, cl_device_id device, const char *op_file,
                          const char *options, const char *kernel_name, cl_kernel *kernel) {
    cl_program program = NULL;
    char all_options[2048];
    int status = full_options(options, all_options, sizeof all_options);
    if (status == CLATTN_SUCCESS)
        status = get_program(context, device, op_file, all_options, &program);
    if (status != CLATTN_SUCCESS) return status;
    cl_int err;
    *kernel = clCreateKernel(program, kernel_name, &err);
    clReleaseProgram(program); /* the kernel holds its own reference */
    if (err != CL_SUCCESS)
        return clattn__fail(err, "clCreateKernel(%s) in cl/%s failed: %s", kernel_name, op_file,
                            clattn_status_name(err));
    return CLATTN_SUCCESS;
}

int clattn__set_arg(cl_kernel kernel, cl_uint index, size_t size, const void *value) {
    cl_int err = clSetKernelArg(kernel, index, size, value);
    if (err != CL_SUCCESS)
        return clattn__fail(err, "clSetKernelArg(%u) failed: %s", index, clattn_status_name(err));
    return CLATTN_SUCCESS;
}

int clattn__set_idx_arg(cl_kernel kernel, cl_uint index, uint64_t value, bool wide) {
    if (wide) {
        cl_ulong v = value;
        return clattn__set_arg(kernel, index, sizeof v, &v);
    }
    cl_uint v = (cl_uint)value;
    return clattn__set_arg(kernel, index, sizeof v, &v);
}

int clattn__set_view_args(cl_kernel kernel, cl_uint *arg, const clattn_tensor *t, int first,
                          bool wide) {
    int status = clattn__set_arg(kernel, (*arg)++, sizeof(cl_mem), &t->buffer);
    if (status == CLATTN_SUCCESS) status = clattn__set_idx_arg(kernel, (*arg)++, t->offset, wide);
    for (int i = first; i < 4 && status == CLATTN_SUCCESS; ++i)
        status = clattn__set_idx_arg(kernel, (*arg)++, (uint64_t)t->strides[i], wide);
    return status;
}

int clattn__parse_group_cap(const char *text, size_t *cap) {
    *cap = SIZE_MAX;
    if (!text || !*text) return CLATTN_SUCCESS;
    unsigned long value = 0;
    const char *p = text;
    while (*p >= '0' && *p <= '9' && value <= 65536)
        value = value * 10 + (unsigned long)(*p++ - '0');
    if (*p || value < 1 || value > 65536)
        return clattn__fail(
            CLATTN_ERR_INVALID_ARGUMENT,
            "CLATTN_MAX_WORK_GROUP=\"%.64s\" is not a work-group size in [1, 65536]", text);
    *cap = value;
    return CLATTN_SUCCESS;
}

int clattn__group_cap(size_t *cap) {
    return clattn__parse_group_cap(getenv("CLATTN_MAX_WORK_GROUP"), cap);
}

int clattn__kernel_max_group(cl_kernel kernel, cl_device_id device, size_t *size) {
    size_t cap;
    int status = clattn__group_cap(&cap);
    if (status != CLATTN_SUCCESS) return status;
    size_t wg = 0, dims[16] = {0};
    cl_uint num_dims = 0;
    cl_int err =
        clGetKernelWorkGroupInfo(kernel, device, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS, sizeof num_dims,
                              &num_dims, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_ITEM_SIZES,
                              sizeof(size_t) * (num_dims < 16 ? num_dims : 16), dims, NULL);
    if (err != CL_SUCCESS) return clattn__cl_fail(err, "querying the kernel's work-group size");
    *size = wg < dims[0] ? wg : dims[0];
    if (*size > cap) *size = cap;
    if (*size == 0) *size = 1;
    return CLATTN_SUCCESS;
}

int clattn__enqueue(const clattn__call *call, cl_kernel kernel, cl_uint dims, const size_t *global,
                    const size_t *local) {
    cl_int err = clEnqueueNDRangeKernel(call->queue, kernel, dims, NULL, global, local,
                                        call->num_wait, call->wait_list, call->event);
    if (err != CL_SUCCESS) {
        if (call->event) *call->event = NULL;
        return clattn__cl_fail(err, "clEnqueueNDRangeKernel");
    }
    return CLATTN_SUCCESS;
}

bool clattn__queue_out_of_order(cl_command_queue queue) {
    cl_command_queue_properties props = 0;
    clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
    return (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0;
}

int clattn__steps_begin(const clattn__call *call) {
    if (call->num_wait == 0) return CLATTN_SUCCESS;
    cl_int err = clEnqueueBarrierWithWaitList(call->queue, call->num_wait, call->wait_list, NULL);
    return err == CL_SUCCESS ? CLATTN_SUCCESS
                             : clattn__cl_fail(err, "clEnqueueBarrierWithWaitList");
}

int clattn__steps_boundary(const clattn__call *call, bool out_of_order) {
    if (!out_of_order) return CLATTN_SUCCESS;
    cl_int err = clEnqueueBarrierWithWaitList(call->queue, 0, NULL, NULL);
    return err == CL_SUCCESS ? CLATTN_SUCCESS
                             : clattn__cl_fail(err, "clEnqueueBarrierWithWaitList");
}

int clattn__steps_end(const clattn__call *call) {
    if (!call->event) return CLATTN_SUCCESS;
    cl_int err = clEnqueueMarkerWithWaitList(call->queue, 0, NULL, call->event);
    if (err == CL_SUCCESS) return CLATTN_SUCCESS;
    *call->event = NULL;
    return clattn__cl_fail(err, "clEnqueueMarkerWithWaitList");
}

int clattn__head_lanes(cl_uint width, int64_t d, int64_t dv) {
    int lanes = width >= 16 ? 16 : width >= 8 ? 8 : width >= 4 ? 4 : 1;
    while (lanes > 1 && (d % lanes || dv % lanes)) lanes /= 2;
    return lanes == 2 ? 1 : lanes;
}
