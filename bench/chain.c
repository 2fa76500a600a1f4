/* The C side of the Python binding's overhead row (bench/bench_python.py): the chain
 * split_qkv -> attention -> merge_heads enqueued from C on the caller's tensors, each chain
 * waited for with clFinish, as the Python chain is. A benchmark helper loaded through ctypes,
 * not part of the library, never installed. */
#include "clattn.h"

#include <time.h>

#define CHAIN_EXPORT __attribute__((visibility("default")))

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int run_chain(cl_command_queue queue, const clattn_tensor *x, int heads, clattn_tensor *qkvo,
                     clattn_tensor *merged) {
    clattn_mask none = {0};
    int status =
        clattn_split_qkv(x, NULL, heads, &qkvo[0], &qkvo[1], &qkvo[2], queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS)
        status = clattn_attention(&qkvo[0], &qkvo[1], &qkvo[2], 0.0f, &none, &qkvo[3], NULL, queue,
                                  0, NULL, NULL);
    if (status == CLATTN_SUCCESS)
        status = clattn_merge_heads(&qkvo[3], merged, queue, 0, NULL, NULL);
    cl_int err = clFinish(queue);
    return status != CLATTN_SUCCESS ? status : err;
}

/* Runs the chain `count` times on x [1,B,S,3E] into q, k, v, o (qkvo[0..3], [B,H,S,D]) and
 * merged [1,B,S,E], storing each chain's wall time in ms. Returns the first failing status. */
CHAIN_EXPORT int clattn_bench_chain(cl_command_queue queue, const clattn_tensor *x, int heads,
                                    clattn_tensor *qkvo, clattn_tensor *merged, int count,
                                    double *times_ms) {
    for (int i = 0; i < count; ++i) {
        double start = now_ms();
        int status = run_chain(queue, x, heads, qkvo, merged);
        if (status != CLATTN_SUCCESS) return status;
        times_ms[i] = now_ms() - start;
    }
    return CLATTN_SUCCESS;
}
