/* Programs built from source. Not installed. */
#ifndef CLATTN_RUNTIME_PROGRAM_BUILD_H
#define CLATTN_RUNTIME_PROGRAM_BUILD_H

#include "status.h"

/* Builds `text` (the joined source of cl/<op_file>) for `device` with `options`. A failed
 * build is CLATTN_ERR_BUILD (or the OpenCL error) with the log, its lines mapped back to
 * cl/<file>:<line>. */
int clattn__program_build(cl_context context, cl_device_id device, const char *text,
                          const char *options, const char *op_file, cl_program *out);

#endif
