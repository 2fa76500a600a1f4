/* The program dump (CLATTN_DUMP_PROGRAMS): every program the library builds (or loads from the
 * disk cache) and the device accepts, as the driver received it, for other compilers to
 * rebuild. Not installed. */
#ifndef CLATTN_RUNTIME_PROGRAM_DUMP_H
#define CLATTN_RUNTIME_PROGRAM_DUMP_H

#include "status.h"

/* With CLATTN_DUMP_PROGRAMS=DIR, writes the joined source `text` of cl/<op_file> to
 * DIR/<op>-<16 hex digits>.cl and its build `options` to the same name with .options (first,
 * so that a .cl file always has its options), named by a hash of both; a pair already there is
 * left alone. A program built from source here (`build_ms` >= 0, not loaded from the disk
 * cache) also gets .log: the build's time and the driver's build log (with NVIDIA's
 * -cl-nv-verbose in CLATTN_BUILD_OPTIONS, ptxas' registers and spills of every kernel). A
 * failure is a warning to the log callback, never an error of the call. */
void clattn__program_dump(const char *op_file, const char *options, const char *text,
                          cl_program program, cl_device_id device, double build_ms);

#endif
