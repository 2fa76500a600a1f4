/*
 * A driver check outside clattn, plain OpenCL: does the compiler keep a loop's divergent
 * branch per work-item when, earlier in the iteration, a branch the whole group takes alike
 * skips the rest of the iteration and its barrier?
 *
 *   probe-barrier-skip [PLATFORM_NAME DEVICE_NAME]   (no names: the first device)
 *
 * Each work-item of one group sums the rows i > 0 its column of a mask keeps:
 *
 *     for (int i = 0; i < rows; ++i) {
 *         barrier(CLK_LOCAL_MEM_FENCE);
 *         if (i == 0) continue;                  <- the whole group alike
 *         barrier(CLK_LOCAL_MEM_FENCE);
 *         if (keep[i * width + lid]) sum += (float)i;   <- each work-item its own
 *     }
 *
 * Valid OpenCL C: every work-item meets every barrier of every iteration. PoCL 3.1 (every
 * work-group method, -O2) gives every work-item the first one's sum; rusticl and Oclgrind give
 * each its own. The same kernel with a barrier on the skipping path (`if (i == 0) { barrier();
 * continue; }`) is right on all three: clattn's backward_keys_tiles skips its blocks so
 * (cl/attention_backward.cl, docs/reliability.md). Prints what each form gave; exits 0 when
 * the form with the barrier is right, 1 when it is not (clattn's workaround fails on this
 * driver), 2 when the probe could not run.
 */
#include "probe_device.h"

#include <stdio.h>

#define ROWS  8
#define WIDTH 8

static const char *source =
    "__kernel void rows_kept(__global const uchar *keep, __global float *out, int rows,\n"
    "                        int width) {\n"
    "    const int lid = (int)get_local_id(0);\n"
    "    float sum = 0.0f;\n"
    "    for (int i = 0; i < rows; ++i) {\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "        if (i == 0) {\n"
    "            SKIP_PATH;\n"
    "            continue;\n"
    "        }\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "        if (keep[i * width + lid]) sum += (float)i;\n"
    "    }\n"
    "    out[lid] = sum;\n"
    "}\n";

/* The mask: column c keeps rows 0 to c + 1, so that every column's sum differs from column
 * 0's. */
static unsigned char kept(int i, int c) {
    return i <= c + 1;
}

/* How many of the WIDTH sums the kernel built with `options` got wrong; -1 if it did not run. */
static int wrong_sums(cl_context context, cl_device_id device, const char *options) {
    unsigned char keep[ROWS * WIDTH];
    for (int i = 0; i < ROWS; ++i)
        for (int c = 0; c < WIDTH; ++c) keep[i * WIDTH + c] = kept(i, c);
    cl_int err = CL_SUCCESS;
    cl_command_queue queue = clCreateCommandQueue(context, device, 0, &err);
    cl_program program = clCreateProgramWithSource(context, 1, &source, NULL, &err);
    cl_kernel kernel = NULL;
    if (program && clBuildProgram(program, 1, &device, options, NULL, NULL) == CL_SUCCESS)
        kernel = clCreateKernel(program, "rows_kept", &err);
    cl_mem mask =
        clCreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof keep, keep, &err);
    cl_mem out = clCreateBuffer(context, CL_MEM_WRITE_ONLY, WIDTH * sizeof(float), NULL, &err);
    const int rows = ROWS, width = WIDTH;
    const size_t items = WIDTH;
    float sums[WIDTH];
    int wrong = -1;
    if (queue && kernel && mask && out && clSetKernelArg(kernel, 0, sizeof mask, &mask) == 0 &&
        clSetKernelArg(kernel, 1, sizeof out, &out) == 0 &&
        clSetKernelArg(kernel, 2, sizeof rows, &rows) == 0 &&
        clSetKernelArg(kernel, 3, sizeof width, &width) == 0 &&
        clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &items, &items, 0, NULL, NULL) == 0 &&
        clEnqueueReadBuffer(queue, out, CL_TRUE, 0, sizeof sums, sums, 0, NULL, NULL) == 0) {
        wrong = 0;
        for (int c = 0; c < WIDTH; ++c) {
            float expected = 0.0f;
            for (int i = 1; i < ROWS; ++i) expected += kept(i, c) ? (float)i : 0.0f;
            wrong += sums[c] != expected;
        }
    }
    if (out) clReleaseMemObject(out);
    if (mask) clReleaseMemObject(mask);
    if (kernel) clReleaseKernel(kernel);
    if (program) clReleaseProgram(program);
    if (queue) clReleaseCommandQueue(queue);
    return wrong;
}

static cl_device_id first_device(void) {
    cl_platform_id platform;
    cl_device_id device;
    if (clGetPlatformIDs(1, &platform, NULL) != CL_SUCCESS ||
        clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL) != CL_SUCCESS)
        return NULL;
    return device;
}

int main(int argc, char **argv) {
    cl_device_id device = argc == 3   ? find_device(argv[1], argv[2])
                          : argc == 1 ? first_device()
                                      : NULL;
    if (!device) {
        fprintf(stderr, "usage: probe-barrier-skip [PLATFORM_NAME DEVICE_NAME] (a device here)\n");
        return 2;
    }
    char name[256] = "";
    clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof name, name, NULL);
    cl_int err = CL_SUCCESS;
    cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    const int plain = context ? wrong_sums(context, device, "-DSKIP_PATH=(void)0") : -1;
    const int fenced =
        context ? wrong_sums(context, device, "-DSKIP_PATH=barrier(CLK_LOCAL_MEM_FENCE)") : -1;
    if (context) clReleaseContext(context);
    if (plain < 0 || fenced < 0) {
        fprintf(stderr, "probe-barrier-skip: the kernel did not run on %s\n", name);
        return 2;
    }
    printf("%s: a skip straight to the loop's first barrier: %d of %d sums wrong\n", name, plain,
           WIDTH);
    printf("%s: with a barrier on the skip path: %d of %d sums wrong\n", name, fenced, WIDTH);
    return fenced == 0 ? 0 : 1;
}
