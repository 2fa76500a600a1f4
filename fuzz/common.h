/* What the fuzz targets share: the device they run on, the status invariant, and environment
 * variables set from fuzz input without leaking. */
#ifndef CLATTN_FUZZ_COMMON_H
#define CLATTN_FUZZ_COMMON_H

#include "runtime/runtime.h"
#include "runtime/program_binary.h"

#include <stddef.h>
#include <stdint.h>

/* The environment on CLATTN_DEVICE's device (PoCL pthread in CI), created on first use. A
 * target without a device cannot run: it says why and exits 1. */
clattn_env *fuzz_env(void);
/* Puts back the handlers of SIGABRT, SIGSEGV, SIGILL and SIGBUS from before the driver loaded.
 * PoCL's LLVM installs crash handlers of its own when the platform loads, and libFuzzer, which
 * installs its handlers after LLVMFuzzerInitialize, leaves a signal that has a handler alone: an
 * abort() (fuzz_fail) would then end the run without saving the input. fuzz_env() does this
 * after it creates the environment; call it again after any other OpenCL setup. */
void fuzz_restore_signals(void);

/* Stops the run (abort, so libFuzzer saves the input) with a message on stderr. */
_Noreturn void fuzz_fail(const char *fmt, ...) CLATTN_PRINTF(1, 2);

/* The invariant of every call: success, or one of the `count` statuses in `allowed` (each a
 * CLATTN_ERR_*) with a non-empty clattn_last_error(). The caller clears the last error first. */
void fuzz_expect(int status, const char *call, const int *allowed, size_t count);
#define FUZZ_EXPECT(status, call, ...)                                                             \
    fuzz_expect((status), (call), (const int[]){__VA_ARGS__},                                      \
                sizeof((const int[]){__VA_ARGS__}) / sizeof(int))

/* Sets (value non-NULL) or unsets an environment variable through a buffer of its own (putenv),
 * so that millions of values do not pile up in the process as setenv's copies would. Values
 * longer than the buffer are cut. At most a few names. */
void fuzz_setenv(const char *name, const char *value);
/* Puts back the value the variable had when the process started. */
void fuzz_restore_env(const char *name);

/* Reads fuzz input a byte at a time; past the end it reads zeros. */
typedef struct fuzz_reader {
    const uint8_t *data;
    size_t size;
} fuzz_reader;
uint8_t fuzz_u8(fuzz_reader *r);
/* Mostly small values (-16..175) and powers of two with their neighbours; raw 64 bits now and
 * then: the values a shape, stride or offset check has edges at. */
int64_t fuzz_i64(fuzz_reader *r);

#endif
