/* The cold-start cost: how long a process waits for the first results of every op family, program
 * builds included (clattn's kernels and CLBlast's GEMM). Measured twice per device: in this
 * process after clearing clattn's and CLBlast's program caches (the driver's own on-disk cache
 * as it is: warm after a first run), and in a child process whose driver caches start empty
 * (POCL_CACHE_DIR pointed at a fresh folder, CUDA_CACHE_DISABLE=1; other drivers keep theirs). */
#include "bench.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Tiny zero-filled f32 tensors for the first calls. */
typedef struct first_ctx {
    clattn_tensor x, heads, scores, q, out, w, b, wo, bo, xm, outm, weights;
} first_ctx;

static int alloc_all(clattn_env *env, first_ctx *c) {
    const int64_t shapes[12][4] = {{1, 1, 16, 128}, {1, 2, 16, 64}, {1, 2, 16, 16},
                                   {1, 2, 16, 64},  {1, 2, 16, 64}, {1, 1, 192, 64},
                                   {1, 1, 1, 192},  {1, 1, 64, 64}, {1, 1, 1, 64},
                                   {1, 1, 16, 64},  {1, 1, 16, 64}, {1, 1, 16, 16}};
    clattn_tensor *all[12] = {&c->x, &c->heads, &c->scores, &c->q,  &c->out,  &c->w,
                              &c->b, &c->wo,    &c->bo,     &c->xm, &c->outm, &c->weights};
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < 12 && status == CLATTN_SUCCESS; ++i) {
        status = clattn_env_alloc(env, CLATTN_F32, shapes[i], all[i]);
        const cl_uchar zero = 0;
        if (status == CLATTN_SUCCESS)
            status = clEnqueueFillBuffer(clattn_env_queue(env), all[i]->buffer, &zero, 1, 0,
                                         (size_t)clattn_tensor_numel(all[i]) * 4, 0, NULL, NULL);
    }
    return status;
}

static void free_all(first_ctx *c) {
    clattn_tensor *all[12] = {&c->x, &c->heads, &c->scores, &c->q,  &c->out,  &c->w,
                              &c->b, &c->wo,    &c->bo,     &c->xm, &c->outm, &c->weights};
    for (int i = 0; i < 12; ++i) clattn_tensor_free(all[i]);
}

/* One call of each family: split heads, causal softmax, causal fused attention, causal linear
 * attention, and MHA self-attention with averaged weights (CLBlast's GEMMs, the composed path,
 * cl/mha.cl), all waited for. */
static int first_calls(clattn_env *env, first_ctx *c) {
    cl_command_queue queue = clattn_env_queue(env);
    clattn_mask causal = {0};
    causal.causal = 1;
    int status = clattn_split_heads(&c->x, 2, &c->heads, queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS)
        status = clattn_softmax(&c->scores, 1.0f, &causal, &c->scores, NULL, queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS)
        status = clattn_attention(&c->q, &c->heads, &c->heads, 0.0f, &causal, &c->out, NULL, queue,
                                  0, NULL, NULL);
    if (status == CLATTN_SUCCESS)
        status = clattn_linear_attention(&c->q, &c->heads, &c->heads, &causal, &c->out, NULL, queue,
                                         0, NULL, NULL);
    const clattn_mha_params p = {2, &c->w, NULL, NULL, NULL, &c->b, &c->wo, &c->bo};
    const clattn_mha_options o = {NULL, NULL, 0, &c->weights, 1, NULL};
    if (status == CLATTN_SUCCESS)
        status = clattn_mha_forward(&c->xm, &c->xm, &c->xm, &p, &c->outm, &o, queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS) status = clFinish(queue);
    return status;
}

int bench_first_calls(clattn_env *env, double *ms) {
    first_ctx c;
    memset(&c, 0, sizeof c);
    int status = alloc_all(env, &c);
    if (status == CLATTN_SUCCESS) status = clFinish(clattn_env_queue(env));
    clattn_cache_clear(NULL); /* clattn's programs and CLBlast's */
    const double start = bench_now_ms();
    if (status == CLATTN_SUCCESS) status = first_calls(env, &c);
    *ms = bench_now_ms() - start;
    free_all(&c);
    return status;
}

double bench_first_calls_empty_cache(const char *spec) {
    char exe[1024], dir[] = "/tmp/clattn-bench-cache-XXXXXX", command[2400], device[300] = "";
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0 || !mkdtemp(dir)) return -1.0;
    exe[n] = '\0';
    if (spec && spec[0]) snprintf(device, sizeof device, "--device '%s'", spec);
    snprintf(command, sizeof command,
             "POCL_CACHE_DIR='%s' CUDA_CACHE_DISABLE=1 '%s' %s --first-calls-only", dir, exe,
             device);
    double ms = -1.0;
    FILE *child = popen(command, "r");
    char line[256];
    while (child && fgets(line, sizeof line, child))
        if (strncmp(line, "first_calls_ms ", 15) == 0) ms = atof(line + 15);
    if (child) pclose(child);
    snprintf(command, sizeof command, "rm -rf '%s'", dir);
    const int removed = system(command); /* a left-over temporary folder is harmless */
    (void)removed;
    return ms;
}
