/*
 * Building a program from source, and turning a failed build's log into a status whose message
 * names cl/<file>:<line> even on compilers that ignore #line.
 */
#include "program_build.h"
#include "hooks.h"
#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int clattn__program_build(cl_context context, cl_device_id device, const char *text,
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
