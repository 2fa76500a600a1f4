/*
 * Program binaries: clattn_cache_export and clattn_cache_import, and the opt-in on-disk cache
 * that CLATTN_CACHE_DIR turns on.
 *
 * Both store entries of one format. An entry stands alone, so an export blob is entries back to
 * back and a cache file is exactly one:
 *
 *   offset  bytes  field (integers little-endian)
 *   0       8      magic "CLATTNPB"
 *   8       4      format version (1)
 *   12      8      FNV-1a 64 hash of the full program text the binary was built from
 *   20      8      binary size B
 *   28      6 x 4  lengths of the six strings that follow
 *   52             op file name ("softmax.cl"), build options, platform name, device name,
 *                  driver version, device version: no terminating NULs, none inside
 *   ...     B      the binary (CL_PROGRAM_BINARIES for the device)
 *   ...     8      checksum: FNV-1a 64 of every byte of the entry before it
 *
 * A reader trusts nothing: each length is checked against the bytes left before it is used, the
 * checksum before any field is, and an entry made for another device identity or source text
 * never reaches the driver. Whatever is wrong with an entry makes it a miss: the next call builds
 * from source.
 */
#include "program_binary.h"
#include "files.h"
#include "program_cache.h"
#include "sources.h"
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { HEADER_BYTES = 52, CHECKSUM_BYTES = 8, FORMAT_VERSION = 1 };
enum { STR_OP, STR_OPTIONS, STR_PLATFORM, STR_DEVICE, STR_DRIVER, STR_VERSION, STR_COUNT };
enum { ID_FIRST = STR_PLATFORM, ID_COUNT = STR_COUNT - STR_PLATFORM };
static const char entry_magic[8] = {'C', 'L', 'A', 'T', 'T', 'N', 'P', 'B'};
/* Longest string of each kind: an op file name, the options (clattn__create_kernel's buffer),
 * and each identity string (longer driver strings are cut to this, the same way every time). */
static const size_t max_length[STR_COUNT] = {64, 2047, 1024, 1024, 1024, 1024};
/* A cache file larger than this is not read (binaries are megabytes at most). */
#define MAX_FILE_BYTES ((size_t)256 << 20)

typedef struct entry {
    const char *strings[STR_COUNT];
    size_t lengths[STR_COUNT];
    uint64_t text_hash;
    const unsigned char *binary;
    size_t binary_size;
} entry;

/* ---- the format ---- */

#define FNV_BASIS 1469598103934665603ull
static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
    return v;
}
static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The bytes an entry takes (its strings are within max_length, so no sum overflows before the
 * binary's, which is checked). 0 when it would not fit in a size_t. */
static size_t entry_bytes(const entry *e) {
    size_t n = HEADER_BYTES + CHECKSUM_BYTES;
    for (int i = 0; i < STR_COUNT; ++i) n += e->lengths[i];
    return e->binary_size > SIZE_MAX - n ? 0 : n + e->binary_size;
}

/* Writes the entry to `out`, which holds entry_bytes(e); returns that size. */
static size_t write_entry(const entry *e, unsigned char *out) {
    memcpy(out, entry_magic, sizeof entry_magic);
    put_u32(out + 8, FORMAT_VERSION);
    put_u64(out + 12, e->text_hash);
    put_u64(out + 20, e->binary_size);
    size_t at = HEADER_BYTES;
    for (int i = 0; i < STR_COUNT; ++i) {
        put_u32(out + 28 + 4 * i, (uint32_t)e->lengths[i]);
        memcpy(out + at, e->strings[i], e->lengths[i]);
        at += e->lengths[i];
    }
    memcpy(out + at, e->binary, e->binary_size);
    at += e->binary_size;
    put_u64(out + at, fnv1a(FNV_BASIS, out, at));
    return at + CHECKSUM_BYTES;
}

typedef enum { ENTRY_OK, ENTRY_CORRUPT, ENTRY_UNREADABLE } entry_read;

/* Parses the entry at the start of data[0, size). ENTRY_OK: *e points into data and *used is its
 * length. ENTRY_CORRUPT: its lengths fit in `size` (*used is what they add up to, so a reader can
 * step over it) but its checksum or strings are wrong. ENTRY_UNREADABLE: not even that. */
static entry_read read_entry(const unsigned char *data, size_t size, entry *e, size_t *used) {
    *used = 0;
    if (size < HEADER_BYTES + CHECKSUM_BYTES || memcmp(data, entry_magic, sizeof entry_magic) != 0)
        return ENTRY_UNREADABLE;
    size_t left = size - HEADER_BYTES - CHECKSUM_BYTES, at = HEADER_BYTES;
    for (int i = 0; i < STR_COUNT; ++i) {
        const uint32_t n = get_u32(data + 28 + 4 * i);
        if (n > max_length[i] || n > left) return ENTRY_UNREADABLE;
        e->strings[i] = (const char *)data + at;
        e->lengths[i] = n;
        at += n;
        left -= n;
    }
    const uint64_t binary_size = get_u64(data + 20);
    if (binary_size > left) return ENTRY_UNREADABLE;
    e->binary = data + at;
    e->binary_size = (size_t)binary_size;
    at += e->binary_size;
    e->text_hash = get_u64(data + 12);
    *used = at + CHECKSUM_BYTES;
    if (get_u32(data + 8) != FORMAT_VERSION || get_u64(data + at) != fnv1a(FNV_BASIS, data, at))
        return ENTRY_CORRUPT;
    for (int i = 0; i < STR_COUNT; ++i)
        if (memchr(e->strings[i], '\0', e->lengths[i])) return ENTRY_CORRUPT;
    return ENTRY_OK;
}

/* A string field as a C string, in `out` (max_length + 1 bytes). */
static const char *entry_string(const entry *e, int which, char *out) {
    memcpy(out, e->strings[which], e->lengths[which]);
    out[e->lengths[which]] = '\0';
    return out;
}

static bool entry_string_is(const entry *e, int which, const char *text) {
    return e->lengths[which] == strlen(text) && memcmp(e->strings[which], text, strlen(text)) == 0;
}

/* ---- the device and the driver ---- */

/* Platform name, device name, driver version, device version: what a binary is only good for. */
typedef struct identity {
    char *strings[ID_COUNT];
} identity;

static void identity_free(identity *id) {
    for (int i = 0; i < ID_COUNT; ++i) free(id->strings[i]);
}

/* One string query, cut to max_length. */
static cl_int query_string(cl_platform_id platform, cl_device_id device, cl_uint param,
                           char **out) {
    size_t n = 0;
    cl_int err = platform ? clGetPlatformInfo(platform, param, 0, NULL, &n)
                          : clGetDeviceInfo(device, param, 0, NULL, &n);
    char *text = err == CL_SUCCESS ? malloc(n + 1) : NULL;
    if (err == CL_SUCCESS && !text) err = CL_OUT_OF_HOST_MEMORY;
    if (err == CL_SUCCESS)
        err = platform ? clGetPlatformInfo(platform, param, n, text, NULL)
                       : clGetDeviceInfo(device, param, n, text, NULL);
    if (err != CL_SUCCESS) {
        free(text);
        return err;
    }
    text[n] = '\0';
    if (strlen(text) > max_length[STR_PLATFORM]) text[max_length[STR_PLATFORM]] = '\0';
    *out = text;
    return CL_SUCCESS;
}

/* The device's identity; records nothing (the disk cache's misses are silent). */
static cl_int query_identity(cl_device_id device, identity *id) {
    *id = (identity){{NULL}};
    cl_platform_id platform = NULL;
    cl_int err = clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL);
    if (err == CL_SUCCESS) err = query_string(platform, NULL, CL_PLATFORM_NAME, &id->strings[0]);
    if (err == CL_SUCCESS) err = query_string(NULL, device, CL_DEVICE_NAME, &id->strings[1]);
    if (err == CL_SUCCESS) err = query_string(NULL, device, CL_DRIVER_VERSION, &id->strings[2]);
    if (err == CL_SUCCESS) err = query_string(NULL, device, CL_DEVICE_VERSION, &id->strings[3]);
    if (err != CL_SUCCESS) identity_free(id);
    return err;
}

static bool entry_matches_identity(const entry *e, const identity *id) {
    for (int i = 0; i < ID_COUNT; ++i)
        if (!entry_string_is(e, ID_FIRST + i, id->strings[i])) return false;
    return true;
}

/* The binary `program` holds for `device`: its size, and (when `binary` is not NULL) a malloc'ed
 * copy. False when the driver has none for it. */
static bool program_binary(cl_program program, cl_device_id device, unsigned char **binary,
                           size_t *size) {
    cl_uint count = 0;
    if (clGetProgramInfo(program, CL_PROGRAM_NUM_DEVICES, sizeof count, &count, NULL) !=
            CL_SUCCESS ||
        count == 0 || count > 4096)
        return false;
    cl_device_id *devices = calloc(count, sizeof *devices);
    size_t *sizes = calloc(count, sizeof *sizes);
    unsigned char **copies = calloc(count, sizeof *copies);
    bool ok = devices && sizes && copies &&
              clGetProgramInfo(program, CL_PROGRAM_DEVICES, count * sizeof *devices, devices,
                               NULL) == CL_SUCCESS &&
              clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, count * sizeof *sizes, sizes,
                               NULL) == CL_SUCCESS;
    cl_uint mine = count;
    for (cl_uint i = 0; ok && i < count; ++i)
        if (devices[i] == device) mine = i;
    ok = ok && mine < count && sizes[mine] > 0;
    if (ok && binary) {
        /* room for every device's binary, not only ours: drivers that ignore the rule to skip
         * NULL entries must not write through one */
        for (cl_uint i = 0; ok && i < count; ++i) ok = (copies[i] = malloc(sizes[i] + 1)) != NULL;
        ok = ok && clGetProgramInfo(program, CL_PROGRAM_BINARIES, count * sizeof *copies, copies,
                                    NULL) == CL_SUCCESS;
        if (ok) {
            *binary = copies[mine];
            copies[mine] = NULL;
        }
    }
    if (ok) *size = sizes[mine];
    for (cl_uint i = 0; copies && i < count; ++i) free(copies[i]);
    free(copies);
    free(sizes);
    free(devices);
    return ok;
}

/* A program for `device` made from the entry's binary and built with its options, or NULL when
 * the driver refuses it. */
static cl_program program_from_entry(cl_context context, cl_device_id device, const entry *e) {
    char options[2048];
    entry_string(e, STR_OPTIONS, options);
    const unsigned char *binary = e->binary;
    size_t size = e->binary_size;
    cl_int binary_status = CL_SUCCESS, err = CL_SUCCESS;
    cl_program program =
        clCreateProgramWithBinary(context, 1, &device, &size, &binary, &binary_status, &err);
    if (err == CL_SUCCESS && binary_status == CL_SUCCESS)
        err = clBuildProgram(program, 1, &device, options, NULL, NULL);
    else if (err == CL_SUCCESS)
        err = binary_status;
    if (err != CL_SUCCESS && program) {
        clReleaseProgram(program);
        program = NULL;
    }
    return err == CL_SUCCESS ? program : NULL;
}

/* An entry for a cached program, its binary fetched or not (binary_size set either way). */
static bool entry_for(const identity *id, const char *op_file, const char *options,
                      uint64_t text_hash, cl_program program, cl_device_id device, bool fetch,
                      unsigned char **binary, entry *e) {
    *binary = NULL;
    const char *strings[STR_COUNT] = {op_file,        options,        id->strings[0],
                                      id->strings[1], id->strings[2], id->strings[3]};
    for (int i = 0; i < STR_COUNT; ++i) {
        e->strings[i] = strings[i];
        e->lengths[i] = strlen(strings[i]);
        if (e->lengths[i] > max_length[i]) return false;
    }
    e->text_hash = text_hash;
    if (!program_binary(program, device, fetch ? binary : NULL, &e->binary_size)) return false;
    e->binary = *binary;
    return entry_bytes(e) != 0;
}

/* ---- export and import ---- */

int clattn_cache_export(cl_context context, cl_device_id device, void *data, size_t capacity,
                        size_t *size) {
    clattn__clear_error();
    if (!context || !device || !size)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                            "clattn_cache_export: context, device and size must not be NULL");
    identity id;
    cl_int err = query_identity(device, &id);
    if (err != CL_SUCCESS) return clattn__cl_fail(err, "clattn_cache_export: querying the device");
    clattn__cached_program *list = NULL;
    size_t count = 0, total = 0;
    int status = clattn__cache_snapshot(context, device, &list, &count);
    size_t *bytes = status == CLATTN_SUCCESS ? calloc(count + 1, sizeof *bytes) : NULL;
    if (status == CLATTN_SUCCESS && !bytes)
        status = clattn__fail(CLATTN_ERR_OUT_OF_HOST_MEMORY, "clattn_cache_export: no memory");
    /* sizes first: a size query or a buffer too small fetches no binary */
    for (size_t i = 0; status == CLATTN_SUCCESS && i < count; ++i) {
        entry e;
        unsigned char *none = NULL;
        if (entry_for(&id, list[i].op_file, list[i].options, list[i].text_hash, list[i].program,
                      device, false, &none, &e) &&
            entry_bytes(&e) <= SIZE_MAX - total)
            total += bytes[i] = entry_bytes(&e);
    }
    if (status == CLATTN_SUCCESS) *size = total;
    if (status == CLATTN_SUCCESS && data && capacity < total)
        status = clattn__fail(CLATTN_ERR_BUFFER_TOO_SMALL,
                              "clattn_cache_export: the programs take %zu bytes, capacity is %zu",
                              total, capacity);
    size_t written = 0;
    for (size_t i = 0; status == CLATTN_SUCCESS && data && i < count; ++i) {
        entry e;
        unsigned char *binary = NULL;
        if (bytes[i] &&
            entry_for(&id, list[i].op_file, list[i].options, list[i].text_hash, list[i].program,
                      device, true, &binary, &e) &&
            entry_bytes(&e) == bytes[i])
            written += write_entry(&e, (unsigned char *)data + written);
        free(binary);
    }
    if (status == CLATTN_SUCCESS && data) *size = written;
    free(bytes);
    clattn__cache_snapshot_free(list, count);
    identity_free(&id);
    return status;
}

/* One of the library's kernel files (the names a blob may carry are checked before any use). */
static bool known_source_name(const char *name) {
    for (size_t i = 0; i < clattn__embedded_sources_count; ++i)
        if (strcmp(clattn__embedded_sources[i].name, name) == 0) return true;
    return false;
}

/* Why this entry cannot be used for `device` now, or NULL when it became a cache entry (*added
 * false when the cache held that program already). */
static const char *import_entry(cl_context context, cl_device_id device, const identity *id,
                                const entry *e, bool *added) {
    char op_file[65];
    uint64_t key = 0, text_hash = 0;
    *added = false;
    if (!entry_matches_identity(e, id)) return "it was built by another device or driver";
    if (!known_source_name(entry_string(e, STR_OP, op_file))) return "it names no clattn kernel";
    if (clattn__program_hashes(op_file, &key, &text_hash) != CLATTN_SUCCESS)
        return "its kernel source cannot be read";
    if (text_hash != e->text_hash) return "it was built from another source text";
    cl_program program = program_from_entry(context, device, e);
    if (!program) return "the driver refuses its binary";
    char options[2048];
    *added = clattn__cache_adopt(context, device, op_file, entry_string(e, STR_OPTIONS, options),
                                 key, text_hash, program);
    return NULL;
}

int clattn_cache_import(cl_context context, cl_device_id device, const void *data, size_t size,
                        size_t *imported) {
    clattn__clear_error();
    if (imported) *imported = 0;
    if (!context || !device || !data)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                            "clattn_cache_import: context, device and data must not be NULL");
    identity id;
    cl_int err = query_identity(device, &id);
    if (err != CL_SUCCESS) return clattn__cl_fail(err, "clattn_cache_import: querying the device");
    const unsigned char *bytes = data;
    size_t at = 0, count = 0;
    for (int index = 0; at < size; ++index) {
        entry e;
        size_t used;
        entry_read read = read_entry(bytes + at, size - at, &e, &used);
        if (read == ENTRY_UNREADABLE) {
            clattn__warn("clattn_cache_import: skipped the last %zu bytes, which hold no entry",
                         size - at);
            break;
        }
        at += used;
        bool added = false;
        const char *why = read == ENTRY_CORRUPT ? "its checksum or strings are wrong"
                                                : import_entry(context, device, &id, &e, &added);
        if (why) clattn__warn("clattn_cache_import: skipped entry %d: %s", index, why);
        count += added;
    }
    identity_free(&id);
    clattn__clear_error(); /* a skipped entry is a miss, not a failure */
    if (imported) *imported = count;
    return CLATTN_SUCCESS;
}

size_t clattn__cache_blob_scan(const void *data, size_t size, size_t *entries, size_t *corrupt) {
    const unsigned char *bytes = data;
    size_t at = 0;
    *entries = *corrupt = 0;
    while (at < size) {
        entry e;
        size_t used;
        entry_read read = read_entry(bytes + at, size - at, &e, &used);
        if (read == ENTRY_UNREADABLE) break;
        at += used;
        ++*entries;
        *corrupt += read == ENTRY_CORRUPT;
    }
    return at;
}

/* ---- the on-disk cache ---- */

static const char *cache_dir(void) {
    const char *dir = getenv("CLATTN_CACHE_DIR");
    return dir && *dir ? dir : NULL;
}

/* <dir>/<16 hex digits>.clbin: the name hashes the device identity, the options and the text. */
static char *cache_path(const char *dir, const identity *id, const char *options,
                        uint64_t text_hash) {
    const char *fields[ID_COUNT + 1] = {id->strings[0], id->strings[1], id->strings[2],
                                        id->strings[3], options};
    uint64_t h = FNV_BASIS;
    unsigned char word[8];
    for (int i = 0; i < ID_COUNT + 1; ++i) {
        put_u64(word, strlen(fields[i])); /* length-prefixed, so no two field lists collide */
        h = fnv1a(fnv1a(h, word, 8), fields[i], strlen(fields[i]));
    }
    put_u64(word, text_hash);
    h = fnv1a(h, word, 8);
    size_t n = strlen(dir) + 1 + 16 + 6 + 1;
    char *path = malloc(n);
    if (path) snprintf(path, n, "%s/%016llx.clbin", dir, (unsigned long long)h);
    return path;
}

/* The whole of a regular file up to MAX_FILE_BYTES (malloc'ed), or NULL with errno set. Only a
 * file of this user's, not reached through a symbolic link: its binary goes to the driver. */
static unsigned char *read_whole(const char *path, size_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return NULL;
    struct stat st;
    unsigned char *data = NULL;
    int saved = EINVAL;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && st.st_size > 0 &&
        (uint64_t)st.st_size <= MAX_FILE_BYTES) {
        size_t n = (size_t)st.st_size, got = 0;
        data = malloc(n);
        while (data && got < n) {
            ssize_t r = read(fd, data + got, n - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) { /* an error, or the file shrank under us */
                saved = r < 0 ? errno : EINVAL;
                free(data);
                data = NULL;
                break;
            }
            got += (size_t)r;
        }
        *size = n;
    }
    close(fd);
    if (!data) errno = saved;
    return data;
}

bool clattn__disk_cache_load(cl_context context, cl_device_id device, const char *op_file,
                             const char *options, uint64_t text_hash, cl_program *out) {
    const char *dir = cache_dir();
    identity id;
    if (!dir || query_identity(device, &id) != CL_SUCCESS) return false;
    char *path = cache_path(dir, &id, options, text_hash);
    if (!path) {
        identity_free(&id);
        return false;
    }
    size_t size = 0, used = 0;
    unsigned char *data = read_whole(path, &size);
    const char *why = NULL;
    entry e;
    if (!data)
        why = errno == ENOENT ? NULL : "unreadable";
    else if (read_entry(data, size, &e, &used) != ENTRY_OK || used != size)
        why = "truncated or corrupt";
    else if (!entry_matches_identity(&e, &id))
        why = "for another device or driver";
    else if (!entry_string_is(&e, STR_OP, op_file) || !entry_string_is(&e, STR_OPTIONS, options) ||
             e.text_hash != text_hash)
        why = "for another program";
    else if (!(*out = program_from_entry(context, device, &e)))
        why = "refused by the driver";
    if (why) clattn__warn("CLATTN_CACHE_DIR: %s is %s; building from source", path, why);
    const bool loaded = data && !why;
    free(data);
    free(path);
    identity_free(&id);
    return loaded;
}

void clattn__disk_cache_store(cl_device_id device, const char *op_file, const char *options,
                              uint64_t text_hash, cl_program program) {
    const char *dir = cache_dir();
    identity id;
    if (!dir || query_identity(device, &id) != CL_SUCCESS) return;
    entry e;
    unsigned char *binary = NULL, *data = NULL;
    char *path = NULL;
    const char *why = NULL;
    if (!entry_for(&id, op_file, options, text_hash, program, device, true, &binary, &e))
        why = "the driver gives no binary";
    else if (!(data = malloc(entry_bytes(&e))) ||
             !(path = cache_path(dir, &id, options, text_hash)))
        why = "out of memory";
    char text[128];
    if (!why) {
        const size_t size = write_entry(&e, data);
        if (!clattn__write_file(path, data, size, text, sizeof text)) why = text;
    }
    if (why)
        clattn__warn("CLATTN_CACHE_DIR: cannot store cl/%s's binary in %s: %s", op_file, dir, why);
    free(path);
    free(data);
    free(binary);
    identity_free(&id);
}
