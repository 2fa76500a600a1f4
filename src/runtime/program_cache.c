/*
 * The program cache: built programs keyed by (context, device, source hash, options). The lock
 * guards only the table: a build runs unlocked (src/runtime/kernel.c), so two threads that miss
 * at once may both build; the second to finish keeps the first's program and drops its own.
 * Entries also keep their op file and the hash of their full text, for clattn_cache_export.
 */
#include "program_cache.h"
#include "hash.h"
#include "kernel_args.h"
#include "sources.h"
#include "status.h"
#include "testing.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A kernel of an entry's program that calls take in turn (clattn__cache_lend_kernel): creating
 * one was most of the driver's work in a call whose program is cached (PoCL: 8k of 28k
 * instructions), and a kernel whose arguments one thread sets cannot be another's meanwhile, so
 * each is lent to one call at a time and comes back when the call has enqueued it. The slot
 * holds a reference of its own and the borrower another, so a kernel in a slot is always alive
 * (a slot's handle can never be a freed kernel's, or another kernel's at the same address). */
enum { KEPT_KERNELS = 12 }; /* the most one call takes is 9 (linear attention's backward) */
typedef struct kept_kernel {
    cl_kernel kernel; /* NULL: a free slot */
    char name[48];
    bool lent;
    clattn__kernel_memo *memo; /* the slot's between calls, the borrower's during one */
} kept_kernel;

typedef struct cache_entry {
    struct cache_entry *next;
    cl_context context;
    cl_device_id device;
    uint64_t source_hash;
    char *options;
    cl_program program;
    char *op_file;
    uint64_t text_hash; /* of the full text, even where source_hash is the file name's */
    kept_kernel kept[KEPT_KERNELS];
} cache_entry;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static cache_entry *cache_head;
static size_t cache_builds, cache_hits;

/* FNV-1a, 64 bit: the key needs only to tell edited sources apart. */
uint64_t clattn__text_hash(const char *text) {
    return clattn__hash_bytes(CLATTN__HASH_START, text, strlen(text));
}

/* Caller holds cache_lock. The entry of the key, or NULL. */
static cache_entry *entry_of(cl_context context, cl_device_id device, uint64_t hash,
                             const char *options) {
    for (cache_entry *e = cache_head; e; e = e->next)
        if (e->context == context && e->device == device && e->source_hash == hash &&
            strcmp(e->options, options) == 0)
            return e;
    return NULL;
}

/* Caller holds cache_lock. Returns a retained program or NULL. */
static cl_program cache_find(cl_context context, cl_device_id device, uint64_t hash,
                             const char *options) {
    cache_entry *e = entry_of(context, device, hash, options);
    if (e) clRetainProgram(e->program);
    return e ? e->program : NULL;
}

/* Caller holds cache_lock. The slot holding `kernel`, or NULL. */
static kept_kernel *slot_of(cl_kernel kernel) {
    for (cache_entry *e = cache_head; e; e = e->next)
        for (int i = 0; i < KEPT_KERNELS; ++i)
            if (e->kept[i].kernel == kernel) return &e->kept[i];
    return NULL;
}

cl_kernel clattn__cache_lend_kernel(cl_context context, cl_device_id device, uint64_t key,
                                    const char *options, const char *name,
                                    clattn__kernel_memo **memo) {
    cl_kernel kernel = NULL;
    *memo = NULL;
    pthread_mutex_lock(&cache_lock);
    cache_entry *e = entry_of(context, device, key, options);
    for (int i = 0; e && !kernel && i < KEPT_KERNELS; ++i) {
        kept_kernel *k = &e->kept[i];
        if (!k->kernel || k->lent || strcmp(k->name, name) != 0) continue;
        k->lent = true, kernel = k->kernel;
        *memo = k->memo, k->memo = NULL;
    }
    if (kernel) ++cache_hits, clRetainKernel(kernel); /* the borrower's reference */
    pthread_mutex_unlock(&cache_lock);
    return kernel;
}

/* Caller holds cache_lock. The slot for a new kernel of `name` in the entry: a free one, else
 * one that holds an idle copy of another name kept more than once (so that a burst of calls on
 * one kernel leaves room for the program's other kernels; never a lent one), or NULL. */
static kept_kernel *slot_for(cache_entry *e, const char *name) {
    kept_kernel *spare = NULL;
    for (int i = 0; i < KEPT_KERNELS; ++i) {
        kept_kernel *k = &e->kept[i];
        if (!k->kernel) return k;
        if (spare || k->lent || strcmp(k->name, name) == 0) continue;
        for (int j = 0; j < KEPT_KERNELS && !spare; ++j)
            if (j != i && e->kept[j].kernel && strcmp(e->kept[j].name, k->name) == 0) spare = k;
    }
    if (spare) {
        clReleaseKernel(spare->kernel); /* the slot's reference (a call giving it back
                                         * may still hold its own) */
        clattn__kernel_memo_free(spare->memo);
    }
    return spare;
}

void clattn__cache_keep_kernel(cl_program program, const char *name, cl_kernel kernel) {
    if (strlen(name) >= sizeof((kept_kernel *)0)->name) return;
    pthread_mutex_lock(&cache_lock);
    cache_entry *e = cache_head;
    while (e && e->program != program) e = e->next;
    kept_kernel *k = e ? slot_for(e, name) : NULL;
    if (k) {
        clRetainKernel(kernel); /* the slot's reference */
        *k = (kept_kernel){.kernel = kernel, .lent = true};
        strcpy(k->name, name);
    }
    pthread_mutex_unlock(&cache_lock);
}

bool clattn__cache_take_back_kernel(cl_kernel kernel, clattn__kernel_memo *memo) {
    pthread_mutex_lock(&cache_lock);
    kept_kernel *k = slot_of(kernel);
    if (k) {
        k->lent = false;
        clattn__kernel_memo_free(k->memo); /* (none: the memo went with the loan) */
        k->memo = memo;
    }
    pthread_mutex_unlock(&cache_lock);
    if (!k) clattn__kernel_memo_free(memo);
    return k != NULL;
}

void clattn__cache_forget_kernel(cl_kernel kernel) {
    pthread_mutex_lock(&cache_lock);
    kept_kernel *k = slot_of(kernel);
    if (k) {
        clReleaseKernel(k->kernel); /* the slot's reference; the holder keeps its own */
        clattn__kernel_memo_free(k->memo);
        *k = (kept_kernel){.kernel = NULL};
    }
    pthread_mutex_unlock(&cache_lock);
}

static char *copy_string(const char *text) {
    char *copy = malloc(strlen(text) + 1);
    return copy ? strcpy(copy, text) : NULL;
}

cl_program clattn__cache_lookup(cl_context context, cl_device_id device, uint64_t key,
                                const char *options) {
    pthread_mutex_lock(&cache_lock);
    cl_program program = cache_find(context, device, key, options);
    if (program) ++cache_hits;
    pthread_mutex_unlock(&cache_lock);
    return program;
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
cl_program clattn__cache_insert(cl_context context, cl_device_id device, uint64_t hash,
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

/* The text hashes of CLATTN_KERNEL_DIR sources, by op file and the stamp of their files: a
 * call whose files are unchanged takes the hash from here instead of reading and hashing some
 * 100 KB of text (which cost a 0.1-ms kernel more than its own time on a GPU). */
enum { SOURCE_MEMO_SIZE = 32 };
typedef struct source_memo {
    char op_file[48];
    uint64_t stamp, hash;
} source_memo;
static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;
static source_memo source_memos[SOURCE_MEMO_SIZE];

/* The memo slot of op_file: its own, else the first free one (NULL when the table is full). */
static source_memo *memo_slot(const char *op_file) {
    source_memo *free_slot = NULL;
    for (int i = 0; i < SOURCE_MEMO_SIZE; ++i) {
        if (strcmp(source_memos[i].op_file, op_file) == 0) return &source_memos[i];
        if (!free_slot && !source_memos[i].op_file[0]) free_slot = &source_memos[i];
    }
    return free_slot;
}

/* The hash of op_file's CLATTN_KERNEL_DIR text, and the text itself when it had to be read. */
static int dir_source_key(const char *op_file, char **text, uint64_t *hash) {
    uint64_t stamp;
    int status = clattn__program_stamp(op_file, &stamp);
    if (status != CLATTN_SUCCESS) return status;
    const bool memo = strlen(op_file) < sizeof source_memos[0].op_file; /* else read each call */
    pthread_mutex_lock(&memo_lock);
    source_memo *slot = memo ? memo_slot(op_file) : NULL;
    const bool known = slot && slot->op_file[0] && slot->stamp == stamp;
    if (known) *hash = slot->hash;
    pthread_mutex_unlock(&memo_lock);
    if (known) return CLATTN_SUCCESS;
    status = clattn__program_source(op_file, text);
    if (status != CLATTN_SUCCESS) return status;
    *hash = clattn__text_hash(*text);
    pthread_mutex_lock(&memo_lock);
    if (memo && (slot = memo_slot(op_file))) {
        snprintf(slot->op_file, sizeof slot->op_file, "%s", op_file);
        slot->stamp = stamp, slot->hash = *hash;
    }
    pthread_mutex_unlock(&memo_lock);
    return CLATTN_SUCCESS;
}

/* The cache key of an op file's source. Embedded sources never change within a process, so
 * their key is the file name and the text is assembled only on a miss; sources read from
 * CLATTN_KERNEL_DIR are keyed by their text's hash, re-read whenever a file's stamp changes
 * (clattn__program_stamp), so an edit is picked up without a restart. */
int clattn__program_key(const char *op_file, char **text, uint64_t *hash) {
    const char *dir = getenv("CLATTN_KERNEL_DIR");
    *text = NULL;
    if (!(dir && *dir)) {
        *hash = clattn__text_hash(op_file) ^ 0x656d626564646564ull; /* "embedded" */
        return CLATTN_SUCCESS;
    }
    return dir_source_key(op_file, text, hash);
}

void clattn__program_cache_clear(cl_context context) {
    pthread_mutex_lock(&cache_lock);
    cache_entry **link = &cache_head;
    while (*link) {
        cache_entry *e = *link;
        if (!context || e->context == context) {
            *link = e->next;
            /* (a kernel lent to a call now lives on in that call's reference) */
            for (int i = 0; i < KEPT_KERNELS; ++i) {
                if (e->kept[i].kernel) clReleaseKernel(e->kept[i].kernel);
                clattn__kernel_memo_free(e->kept[i].memo); /* (a lent one's is its borrower's) */
            }
            clReleaseProgram(e->program);
            free(e->options);
            free(e->op_file);
            free(e);
        } else {
            link = &e->next;
        }
    }
    pthread_mutex_unlock(&cache_lock);
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

void clattn__kept_kernels(size_t *kept, size_t *lent) {
    *kept = *lent = 0;
    pthread_mutex_lock(&cache_lock);
    for (cache_entry *e = cache_head; e; e = e->next)
        for (int i = 0; i < KEPT_KERNELS; ++i) {
            *kept += e->kept[i].kernel != NULL;
            *lent += e->kept[i].kernel && e->kept[i].lent;
        }
    pthread_mutex_unlock(&cache_lock);
}

/* ---- for program binaries (program_binary.c) ---- */

int clattn__program_hashes(const char *op_file, uint64_t *key, uint64_t *text_hash) {
    char *text = NULL;
    int status = clattn__program_key(op_file, &text, key);
    if (status == CLATTN_SUCCESS && !text) status = clattn__program_source(op_file, &text);
    if (status == CLATTN_SUCCESS) *text_hash = clattn__text_hash(text);
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
