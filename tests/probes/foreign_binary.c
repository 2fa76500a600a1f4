/*
 * A driver check outside clattn, plain OpenCL: does the driver refuse a program binary it did
 * not write, as clCreateProgramWithBinary must (CL_INVALID_BINARY), or does it crash?
 *
 *   probe-foreign-binary PLATFORM_NAME DEVICE_NAME
 *
 * Builds a one-line kernel on the named device, then hands the driver a binary of the same size
 * made of 0x7F bytes. Prints what the driver returned and exits 0; exits 2 when the device is
 * not found or the build fails. Mesa 22.3's rusticl aborts the process here (a Rust panic,
 * "unknown version" in its program deserializer), so a crash is the answer "it cannot".
 * tests/test_cache_files.c runs it before it hands a driver such a binary.
 */
#include "probe_device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    cl_device_id device = argc == 3 ? find_device(argv[1], argv[2]) : NULL;
    if (!device) {
        fprintf(stderr, "usage: probe-foreign-binary PLATFORM_NAME DEVICE_NAME (a device here)\n");
        return 2;
    }
    cl_int err = CL_SUCCESS;
    cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    const char *source = "__kernel void k(__global int *x) { x[0] = 1; }";
    cl_program program =
        context ? clCreateProgramWithSource(context, 1, &source, NULL, &err) : NULL;
    size_t size = 0;
    if (!program || clBuildProgram(program, 1, &device, "", NULL, NULL) != CL_SUCCESS ||
        clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) !=
            CL_SUCCESS ||
        size == 0) {
        fprintf(stderr, "probe-foreign-binary: no binary to imitate (error %d)\n", err);
        return 2;
    }
    unsigned char *foreign = malloc(size);
    if (!foreign) return 2;
    memset(foreign, 0x7F, size);
    const unsigned char *binaries[1] = {foreign};
    cl_int binary_status = CL_SUCCESS;
    cl_program refused =
        clCreateProgramWithBinary(context, 1, &device, &size, binaries, &binary_status, &err);
    printf("clCreateProgramWithBinary on %zu bytes of 0x7F: error %d, binary status %d\n", size,
           err, binary_status);
    if (refused) clReleaseProgram(refused);
    free(foreign);
    clReleaseProgram(program);
    clReleaseContext(context);
    return 0;
}
