/*
 * The program dump: source and options of each program, for the compile lane (ci/test.sh) and
 * for anyone rebuilding a program with another vendor's compiler.
 */
#include "program_dump.h"
#include "files.h"
#include "program_cache.h"
#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Writes DIR/NAME.SUFFIX; false with a warning. */
static bool dump_file(const char *dir, const char *name, const char *suffix, const char *text) {
    char path[4096], why[128];
    if ((size_t)snprintf(path, sizeof path, "%s/%s.%s", dir, name, suffix) >= sizeof path) {
        clattn__warn("CLATTN_DUMP_PROGRAMS: the path %s/%s.%s is too long", dir, name, suffix);
        return false;
    }
    if (clattn__write_file(path, text, strlen(text), why, sizeof why)) return true;
    clattn__warn("CLATTN_DUMP_PROGRAMS: cannot write %s: %s", path, why);
    return false;
}

/* DIR/NAME.log: the build's time, then the driver's log of it. */
static void dump_log(const char *dir, const char *name, cl_program program, cl_device_id device,
                     double build_ms) {
    size_t size = 0;
    clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, 0, NULL, &size);
    const size_t head = 64;
    char *text = malloc(head + size + 1);
    if (!text) {
        clattn__warn("CLATTN_DUMP_PROGRAMS: no memory for %s's build log", name);
        return;
    }
    int used = snprintf(text, head, "built in %.0f ms\n", build_ms);
    if (used < 0) used = 0, text[0] = '\0';
    if ((size_t)used >= head) used = (int)head - 1; /* cut, and snprintf ended it there */
    if (size > 0 && clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, size, text + used,
                                          NULL) == CL_SUCCESS)
        text[used + size] = '\0';
    dump_file(dir, name, "log", text);
    free(text);
}

void clattn__program_dump(const char *op_file, const char *options, const char *text,
                          cl_program program, cl_device_id device, double build_ms) {
    const char *dir = getenv("CLATTN_DUMP_PROGRAMS");
    if (!dir || !*dir) return;
    /* the name: the op file's stem and a hash of the options and the text */
    const uint64_t hash = clattn__text_hash(options) * 1099511628211ull ^ clattn__text_hash(text);
    const size_t stem = strcspn(op_file, ".");
    char name[128], path[4096];
    snprintf(name, sizeof name, "%.*s-%016llx", (int)(stem < 64 ? stem : 64), op_file,
             (unsigned long long)hash);
    struct stat st;
    if ((size_t)snprintf(path, sizeof path, "%s/%s.cl", dir, name) < sizeof path &&
        stat(path, &st) == 0)
        return;
    if (dump_file(dir, name, "options", options) && dump_file(dir, name, "cl", text) &&
        build_ms >= 0)
        dump_log(dir, name, program, device, build_ms);
}
